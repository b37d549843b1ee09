-- The lock rows of table mode: one per lock key (owner, re-entry count, token, lease end by the
-- server clock, the holding attempt and the last released one).
CREATE TABLE IF NOT EXISTS dlock_table_locks (
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    owner VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    count INT UNSIGNED NOT NULL,
    token BIGINT UNSIGNED NOT NULL,
    acquired_at DATETIME(6) NULL,
    expires_at DATETIME(6) NOT NULL,
    attempt VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
    last_released VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
) ENGINE=InnoDB
