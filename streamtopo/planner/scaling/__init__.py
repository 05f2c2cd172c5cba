"""How many executors and how big a batch: the target-utilisation and DS2-like scaling rules, and
Aeolus's batch size and degree of parallelism (Sax et al.)."""
