-- collective_skew as SQL over the Parquet export (`skewlens export RUN`, docs/parquet.md).
--
-- One row per member of each collective instance and each matched send/recv pair, with the columns of the
-- collective_skew.parquet that `skewlens analyze` writes, equal row for row: kind, pg_name, seq, comm_type,
-- comm_bytes, step, rank, node_id, arrival_ns, end_ns, wait_ns, exposed_wait_ns, transfer_ns, skew_ns, late_rank,
-- late_by_ns. Not here: blamed_rank and cause_kind / cause_op / cause_delta_ns / cause, which the analysis
-- derives event by event in order of arrival, each from the ones before, and clock_contradicted
-- (docs/parquet.md says more).
--
-- It reads four tables of the export, registered under these names:
--   DuckDB: CREATE VIEW nodes AS SELECT * FROM read_parquet('PARQUET_DIR/nodes/*/*.parquet',
--               hive_partitioning = true);
--           CREATE VIEW model AS SELECT * FROM read_parquet('PARQUET_DIR/model/*/*.parquet',
--               hive_partitioning = true);
--           CREATE VIEW collectives AS SELECT * FROM read_parquet('PARQUET_DIR/collectives.parquet');
--           CREATE VIEW p2p AS SELECT * FROM read_parquet('PARQUET_DIR/p2p.parquet');
--   Spark:  for t in ("nodes", "model", "collectives", "p2p"):
--               spark.read.parquet(f"PARQUET_DIR/{t}" + ("" if t in ("nodes", "model") else ".parquet"))
--                   .createOrReplaceTempView(t)
-- Portable SQL (common table expressions, window functions, CASE, COALESCE, LEAST, GREATEST); no
-- engine's own functions. No trailing semicolon, which Spark's spark.sql() refuses.
WITH
-- Every member of every synchronisation point. member_pos orders the members as the analysis does:
-- a collective's by rank, a pair's sender (0) before its receiver (1). end_ns is the recorded end, which
-- the waits are measured with; model_end_ns the execution model's (the model table's end_ns), which the
-- table gives: earlier where a collective's completion was recorded after the host wait that hid it ended.
members AS (
    SELECT 'collective' AS kind, c.pg_name, c.seq, c.comm_type, c.comm_bytes, c.rank AS member_pos, c.rank,
           c.node_id, c.start_ns AS arrival_ns, c.end_ns, m.end_ns AS model_end_ns, c.step
    FROM collectives c
    JOIN model m ON m.rank = c.rank AND m.node_id = c.node_id
    UNION ALL
    SELECT 'p2p', COALESCE(p.pg_name, ''), p.pair, 'SEND_RECV', n.comm_bytes, 0, p.src_rank,
           p.send_node_id, p.send_start_ns, p.send_end_ns, m.end_ns, n.step
    FROM p2p p
    JOIN nodes n ON n.rank = p.src_rank AND n.node_id = p.send_node_id
    JOIN model m ON m.rank = p.src_rank AND m.node_id = p.send_node_id
    UNION ALL
    SELECT 'p2p', COALESCE(p.pg_name, ''), p.pair, 'SEND_RECV', n.comm_bytes, 1, p.dst_rank,
           p.recv_node_id, p.recv_start_ns, p.recv_end_ns, m.end_ns, n.step
    FROM p2p p
    JOIN nodes n ON n.rank = p.dst_rank AND n.node_id = p.recv_node_id
    JOIN model m ON m.rank = p.dst_rank AND m.node_id = p.recv_node_id
),
-- Rooted collectives (the execution model's waits_for and root_member in skewlens.replay.execution, which
-- this must match; tests/test_skew_sql.py holds it equal to analyze's table on broadcasts, scatters,
-- gathers and reduces): a broadcast's or scatter's root
-- is its nodes' src, a gather's their dst, as the lowest-ranked member recorded it; the instance's type is
-- that member's too. A root that is no member is unknown (the instance is not rooted). A reduce keeps the
-- last arrival for all, so it needs no root.
first_members AS (
    SELECT c.pg_name, c.seq, c.comm_type, c.rank, c.node_id,
           ROW_NUMBER() OVER (PARTITION BY c.pg_name, c.seq ORDER BY c.rank) AS pos
    FROM collectives c
),
roots AS (
    SELECT f.pg_name, f.seq, f.comm_type AS root_type, c.rank AS root_rank, c.start_ns AS root_arrival_ns
    FROM first_members f
    JOIN nodes n ON n.rank = f.rank AND n.node_id = f.node_id
    JOIN collectives c
      ON c.pg_name = f.pg_name AND c.seq = f.seq
     AND c.rank = CASE WHEN f.comm_type = 'GATHER' THEN n.dst ELSE n.src END
    WHERE f.pos = 1 AND f.comm_type IN ('BROADCAST', 'SCATTER', 'GATHER')
),
-- The arrival each member waits for: the last one; with a known root, a broadcast member's the root's (the
-- later of its own and the root's), the root's its own (it waits for no one); a scatter or gather member's
-- the root's, the root's the last one. A member waits from its arrival until then, at most as long as its
-- op lasted; a send done before its recv arrived (eager, as the execution model detaches it, within its
-- SKEW_NS of clock skew: 20000, which a test holds equal) waits for no one, nor does a member of an
-- all_reduce, all_gather, reduce_scatter or reduce whose members' calls are all empty (0 bytes: gloo
-- returns at once, NCCL discards it).
waits AS (
    SELECT a.*,
           CASE WHEN kind = 'p2p' AND member_pos = 0 AND end_ns <= recv_arrival_ns + 20000 THEN 0
                ELSE LEAST(awaited_ns - arrival_ns, end_ns - arrival_ns)
           END AS wait_ns
    FROM (
        SELECT l.*,
               CASE WHEN kind = 'collective' AND max_bytes = 0
                         AND comm_type IN ('ALL_REDUCE', 'ALL_GATHER', 'REDUCE_SCATTER', 'REDUCE')
                    THEN arrival_ns
                    WHEN root_rank IS NULL THEN last_arrival_ns
                    WHEN rank <> root_rank THEN GREATEST(arrival_ns, root_arrival_ns)
                    WHEN root_type = 'BROADCAST' THEN arrival_ns
                    ELSE last_arrival_ns
               END AS awaited_ns
        FROM (
            SELECT m.*, r.root_type, r.root_rank, r.root_arrival_ns,
                   MAX(m.arrival_ns) OVER (PARTITION BY m.kind, m.pg_name, m.seq) AS last_arrival_ns,
                   MIN(m.arrival_ns) OVER (PARTITION BY m.kind, m.pg_name, m.seq) AS first_arrival_ns,
                   MAX(m.comm_bytes) OVER (PARTITION BY m.kind, m.pg_name, m.seq) AS max_bytes,
                   MAX(CASE WHEN m.kind = 'p2p' AND m.member_pos = 1 THEN m.arrival_ns END)
                     OVER (PARTITION BY m.kind, m.pg_name, m.seq) AS recv_arrival_ns,
                   COUNT(*) OVER (PARTITION BY m.kind, m.pg_name, m.seq) AS members
            FROM members m
            LEFT JOIN roots r ON m.kind = 'collective' AND r.pg_name = m.pg_name AND r.seq = m.seq
        ) l
    ) a
),
-- The late member: the one whose arrival the longest wait was for. That is the last to arrive (of equal
-- arrivals, the last in member order), or a rooted instance's root (of two members or more), unless the
-- first member (in member order) with the longest wait, a wait above 0, is a scatter's or gather's root,
-- which waits for the last arrival.
held AS (
    SELECT f.*,
           CASE WHEN root_rank IS NULL OR members < 2 THEN NULL
                WHEN root_type <> 'BROADCAST' AND longest_ns > 0 AND first_longest = root_rank THEN NULL
                ELSE root_rank
           END AS held_rank
    FROM (
        SELECT l.*,
               MIN(CASE WHEN wait_ns = longest_ns THEN member_pos END) OVER (PARTITION BY kind, pg_name, seq)
                 AS first_longest
        FROM (
            SELECT w.*, MAX(wait_ns) OVER (PARTITION BY kind, pg_name, seq) AS longest_ns
            FROM waits w
        ) l
    ) f
),
-- Arrival order, counting from 1: of all members, and of the members other than the held one.
ordered AS (
    SELECT h.*,
           ROW_NUMBER() OVER (PARTITION BY kind, pg_name, seq ORDER BY arrival_ns, member_pos) AS arrival_order,
           ROW_NUMBER() OVER (
               PARTITION BY kind, pg_name, seq, CASE WHEN rank = held_rank THEN 1 ELSE 0 END
               ORDER BY arrival_ns, member_pos) AS other_order
    FROM held h
),
-- The late member is compared with the median of the others: without a held member, the
-- ((members - 1) / 2, rounded down)-th member in arrival order, counting from 0 (2 * position is members - 1
-- or members - 2, whichever is even), the late one included; with one, the ((members - 2) / 2)-th of the
-- others. late_by_ns is how much later the late member arrived, 0 where it did not.
events AS (
    SELECT kind, pg_name, seq, late_rank, step, GREATEST(late_ns - median_ns, 0) AS late_by_ns
    FROM (
        SELECT kind, pg_name, seq,
               MAX(CASE WHEN (held_rank IS NULL AND arrival_order = members OR rank = held_rank) THEN rank END)
                 AS late_rank,
               MAX(CASE WHEN (held_rank IS NULL AND arrival_order = members OR rank = held_rank) THEN step END)
                 AS step,
               MAX(CASE WHEN (held_rank IS NULL AND arrival_order = members OR rank = held_rank)
                        THEN arrival_ns END) AS late_ns,
               MAX(CASE WHEN held_rank IS NULL AND 2 * (arrival_order - 1) IN (members - 1, members - 2)
                          OR (held_rank IS NOT NULL AND rank <> held_rank
                              AND 2 * (other_order - 1) IN (members - 2, members - 3))
                        THEN arrival_ns END) AS median_ns
        FROM ordered
        GROUP BY kind, pg_name, seq
    ) e
),
-- Compute on each rank, all streams and threads together, as the execution model reads it (the model
-- table): the last compute_ns of each node (not the wait nodes, nor host ops that synchronised on the
-- GPU, nor untraced host time; of a gap node that hid a wait, its work after the wait).
compute AS (
    SELECT rank, node_id, end_ns - compute_ns AS start_ns, end_ns
    FROM model
    WHERE compute_ns > 0
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
SELECT w.kind, w.pg_name, w.seq, w.comm_type, w.comm_bytes, e.step, w.rank, w.node_id, w.arrival_ns,
       w.model_end_ns AS end_ns, w.wait_ns, w.wait_ns - COALESCE(x.covered_ns, 0) AS exposed_wait_ns,
       GREATEST(w.model_end_ns - w.arrival_ns - w.wait_ns, 0) AS transfer_ns,
       w.last_arrival_ns - w.first_arrival_ns AS skew_ns,
       e.late_rank, e.late_by_ns
FROM waits w
JOIN events e ON e.kind = w.kind AND e.pg_name = w.pg_name AND e.seq = w.seq
LEFT JOIN covered x
  ON x.kind = w.kind AND x.pg_name = w.pg_name AND x.seq = w.seq AND x.member_pos = w.member_pos
ORDER BY w.last_arrival_ns, w.kind, w.pg_name, w.seq, w.member_pos
