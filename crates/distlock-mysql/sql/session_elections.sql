-- Elections (session mode): the value the leader of each election key advertises, stored
-- with the leader's token (the holder row with that token and a live conn_id is the leader)
-- and the number of its last proclamation.
CREATE TABLE IF NOT EXISTS dlock_elections (
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token BIGINT UNSIGNED NOT NULL,
    value TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    seq BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB
