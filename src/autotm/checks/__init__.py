"""Plans checked without running them: replayed against the graph, budget and residency at
every step (validate), and their time predicted from a cost model (simulate)."""
