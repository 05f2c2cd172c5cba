"""The planner: pure algorithms on plain data (no Kubernetes, Spark, network, files or clock; seeded
randomness; solver limits in deterministic time). The tree follows the papers:

- shared contracts: :mod:`.model` (the spec), :mod:`.graph` (cost model), :mod:`.plan`, :mod:`.routing`,
  :mod:`.allocation`, :mod:`.cluster`, :mod:`.expressions`;
- :mod:`.placement`: fusion and placement (COLA, its constraints, the exact optimum, the baselines);
- :mod:`.rebalance`: key-group rebalancing every period (ALBIC, Flux, PoTC, C-MR, COLA re-optimisation);
- :mod:`.scaling`: horizontal scaling rules and Aeolus's batch size and parallelism;
- :mod:`.adaptation`: ALBIC's Algorithm 1, joining a rebalancer and a scaling rule in one decision;
- :mod:`.simulation`: the simulator and its scenarios, which drive that same decision;
- :mod:`.benoit`: sharing sub-trees across topologies; :mod:`.cmr_scheduling`: C-MR's scheduling policies.
"""
