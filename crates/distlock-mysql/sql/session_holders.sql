-- The holder of each GET_LOCK grant: a row counts only while its conn_id is the one
-- IS_USED_LOCK reports.
CREATE TABLE IF NOT EXISTS dlock_holders (
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL,
    owner VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token BIGINT UNSIGNED NOT NULL,
    count INT UNSIGNED NOT NULL,
    conn_id BIGINT UNSIGNED NOT NULL,
    acquired_at DATETIME(6) NOT NULL,
    expires_at DATETIME(6) NOT NULL,
    PRIMARY KEY (lock_key, owner)
) ENGINE=InnoDB
