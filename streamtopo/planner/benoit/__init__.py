"""Sharing across applications: Benoit, Casanova, Rehn-Sonigo, Robert (INRIA RR-6864, 2009).

Several applications (operator trees, here DAGs) must each produce results at a required rate; identical
sub-trees are computed once, at the highest rate any consumer needs, and the instances are placed on
processors with limited speed, network card and links.

- :mod:`.problem`: the model of Section 2 and an evaluator of constraints (1), (3) and (4);
- :mod:`.heuristics`: H1-H6 with the four processor-selection strategies of Section 5;
- :mod:`.ilp`: the integer program of Section 4 (Proc-Nb, Proc-Power, BW-Sum, BW-Max) on CP-SAT;
- :mod:`.topologies`: StreamTopology resources as a problem (a structural hash finds shared sub-trees);
- :mod:`.instances`: the random instances of Section 6 (seeded).
"""
