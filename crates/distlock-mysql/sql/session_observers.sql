-- Election observers: one row per watching connection (its CONNECTION_ID()), so that a change
-- made through dlock can wake it (`woken = 1`, then `KILL QUERY` of its server-side SLEEP, after
-- checking in the processlist that the connection runs that election's dlock-observe SLEEP).
-- `db_user` is the processlist user of the observer's connection: only that user can tell a
-- row whose connection is gone (it sees its own connections), so only it deletes such rows.
CREATE TABLE IF NOT EXISTS dlock_election_observers (
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL,
    conn_id BIGINT UNSIGNED NOT NULL,
    ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    db_user VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    woken TINYINT NOT NULL,
    registered_at DATETIME(6) NOT NULL,
    PRIMARY KEY (lock_key, conn_id)
) ENGINE=InnoDB
