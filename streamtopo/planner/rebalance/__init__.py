"""Key-group rebalancing once per period: ALBIC (Madsen et al., ICDE 2017) and the policies it is
compared with (Flux, power of two choices, C-MR's rebalancer, COLA re-optimisation), one registry."""
