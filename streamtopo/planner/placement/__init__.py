"""Fusion and placement: operators into processing elements, PEs onto hosts (COLA, Khandekar et al.,
Middleware 2009), the constraints every plan is judged by, the exact optimum and the paper's baselines."""
