-- Last fencing token per lock key (bumped with LAST_INSERT_ID(token + 1) while the lock is held).
CREATE TABLE IF NOT EXISTS dlock_fence (
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB
