-- The last fencing token of a name. $1 ns, $2 name.
SELECT token FROM dlock_fence WHERE ns = $1 AND name = $2
