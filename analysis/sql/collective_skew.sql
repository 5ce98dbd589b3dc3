-- collective_skew as SQL over the Parquet export (`skewlens export RUN`, docs/parquet.md).
--
-- One row per member of each collective instance and each matched send/recv pair, with the columns of the
-- collective_skew.parquet that `skewlens analyze` writes, equal row for row: kind, pg_name, seq, comm_type,
-- step, rank, node_id, arrival_ns, end_ns, wait_ns, exposed_wait_ns, transfer_ns, skew_ns, late_rank,
-- late_by_ns. Not here: blamed_rank and cause_kind / cause_op / cause_delta_ns / cause, which the analysis
-- derives event by event in order of arrival, each from the ones before, and clock_contradicted
-- (docs/parquet.md says more, and where exposed_wait_ns can differ).
--
-- It reads three tables of the export, registered under these names:
--   DuckDB: CREATE VIEW nodes AS SELECT * FROM read_parquet('PARQUET_DIR/nodes/*/*.parquet',
--               hive_partitioning = true);
--           CREATE VIEW collectives AS SELECT * FROM read_parquet('PARQUET_DIR/collectives.parquet');
--           CREATE VIEW p2p AS SELECT * FROM read_parquet('PARQUET_DIR/p2p.parquet');
--   Spark:  for t in ("nodes", "collectives", "p2p"):
--               spark.read.parquet(f"PARQUET_DIR/{t}" + ("" if t == "nodes" else ".parquet"))
--                   .createOrReplaceTempView(t)
-- Portable SQL (common table expressions, window functions, CASE, COALESCE, LEAST, GREATEST); no
-- engine's own functions. No trailing semicolon, which Spark's spark.sql() refuses.
WITH
-- Every member of every synchronisation point. member_pos orders the members as the analysis does:
-- a collective's by rank, a pair's sender (0) before its receiver (1).
members AS (
    SELECT 'collective' AS kind, c.pg_name, c.seq, c.comm_type, c.rank AS member_pos, c.rank,
           c.node_id, c.start_ns AS arrival_ns, c.end_ns, c.step
    FROM collectives c
    UNION ALL
    SELECT 'p2p', COALESCE(p.pg_name, ''), p.pair, 'SEND_RECV', 0, p.src_rank,
           p.send_node_id, p.send_start_ns, p.send_end_ns, n.step
    FROM p2p p
    JOIN nodes n ON n.rank = p.src_rank AND n.node_id = p.send_node_id
    UNION ALL
    SELECT 'p2p', COALESCE(p.pg_name, ''), p.pair, 'SEND_RECV', 1, p.dst_rank,
           p.recv_node_id, p.recv_start_ns, p.recv_end_ns, n.step
    FROM p2p p
    JOIN nodes n ON n.rank = p.dst_rank AND n.node_id = p.recv_node_id
),
ordered AS (
    SELECT m.*,
           MAX(arrival_ns) OVER (PARTITION BY kind, pg_name, seq) AS last_arrival_ns,
           MIN(arrival_ns) OVER (PARTITION BY kind, pg_name, seq) AS first_arrival_ns,
           COUNT(*) OVER (PARTITION BY kind, pg_name, seq) AS members,
           ROW_NUMBER() OVER (PARTITION BY kind, pg_name, seq ORDER BY arrival_ns, member_pos) AS arrival_order
    FROM members m
),
-- A member waits from its arrival until the last member arrives, at most as long as its op lasted.
waits AS (
    SELECT o.*, LEAST(last_arrival_ns - arrival_ns, end_ns - arrival_ns) AS wait_ns
    FROM ordered o
),
-- The late member arrived last (of equal arrivals, the last in member order); the median member is the
-- ((members - 1) / 2, rounded down)-th in arrival order, counting from 0: 2 * position is members - 1 or
-- members - 2, whichever is even.
events AS (
    SELECT kind, pg_name, seq,
           MAX(CASE WHEN arrival_order = members THEN rank END) AS late_rank,
           MAX(CASE WHEN arrival_order = members THEN step END) AS step,
           MAX(CASE WHEN arrival_order = members THEN arrival_ns END)
             - MAX(CASE WHEN 2 * (arrival_order - 1) IN (members - 1, members - 2) THEN arrival_ns END)
             AS late_by_ns
    FROM ordered
    GROUP BY kind, pg_name, seq
),
-- Compute on each rank, all streams and threads together: COMP nodes, less the capture's untraced host
-- time and the wait nodes (these names are skewlens.profiler.vocab's UNTRACED_NODE_NAME and
-- WAIT_NODE_NAMES; a test holds them equal).
compute AS (
    SELECT rank, node_id, start_ns, start_ns + dur_ns AS end_ns
    FROM nodes
    WHERE type = 'COMP' AND dur_ns > 0
      AND name NOT IN ('untraced', '_c10d_functional::wait_tensor', 'c10d::wait')
),
-- Their union as disjoint islands: a node opens an island unless it starts before every earlier one
-- (in start order; node_id makes the order total) has ended.
compute_opens AS (
    SELECT rank, node_id, start_ns, end_ns,
           CASE WHEN start_ns <= MAX(end_ns) OVER (
                    PARTITION BY rank ORDER BY start_ns, end_ns, node_id
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                THEN 0 ELSE 1 END AS opens
    FROM compute
),
compute_numbered AS (
    SELECT rank, start_ns, end_ns,
           SUM(opens) OVER (PARTITION BY rank ORDER BY start_ns, end_ns, node_id ROWS UNBOUNDED PRECEDING)
             AS island
    FROM compute_opens
),
islands AS (
    SELECT rank, MIN(start_ns) AS start_ns, MAX(end_ns) AS end_ns
    FROM compute_numbered
    GROUP BY rank, island
),
-- Compute of the member's rank during its wait; the exposed wait is the rest. (An inner join: LEAST and
-- GREATEST skip NULLs, in DuckDB and Spark alike, so an outer join's missing island would count in full.
-- The cast: DuckDB sums BIGINTs into a 128-bit integer, Spark into a BIGINT.)
covered AS (
    SELECT w.kind, w.pg_name, w.seq, w.member_pos,
           CAST(SUM(LEAST(i.end_ns, w.arrival_ns + w.wait_ns) - GREATEST(i.start_ns, w.arrival_ns)) AS BIGINT)
             AS covered_ns
    FROM waits w
    JOIN islands i
      ON i.rank = w.rank AND i.start_ns < w.arrival_ns + w.wait_ns AND i.end_ns > w.arrival_ns
    GROUP BY w.kind, w.pg_name, w.seq, w.member_pos
)
SELECT w.kind, w.pg_name, w.seq, w.comm_type, e.step, w.rank, w.node_id, w.arrival_ns, w.end_ns,
       w.wait_ns, w.wait_ns - COALESCE(x.covered_ns, 0) AS exposed_wait_ns,
       GREATEST(w.end_ns - w.last_arrival_ns, 0) AS transfer_ns,
       w.last_arrival_ns - w.first_arrival_ns AS skew_ns,
       e.late_rank, e.late_by_ns
FROM waits w
JOIN events e ON e.kind = w.kind AND e.pg_name = w.pg_name AND e.seq = w.seq
LEFT JOIN covered x
  ON x.kind = w.kind AND x.pg_name = w.pg_name AND x.seq = w.seq AND x.member_pos = w.member_pos
ORDER BY w.last_arrival_ns, w.kind, w.pg_name, w.seq, w.member_pos
