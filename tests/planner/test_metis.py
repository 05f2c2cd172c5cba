"""METIS through pymetis: never asked for more parts than vertices, so nothing is printed to the console."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from streamtopo.planner.metis import metis_labels


@pytest.mark.parametrize("fractions", [False, True])
def test_more_parts_than_vertices_prints_nothing_and_gives_each_vertex_its_own_part(capfd, fractions):
    # 12 vertices into 14 parts: METIS 5.1 itself prints "***Cannot bisect a graph with 0 vertices!" and
    # "***You are trying to partition a graph into too many parts!" from C, past Python's sys.stdout.
    matrix = sp.random(12, 12, density=0.3, random_state=12, format="csr")
    weights = np.arange(1.0, 13.0)
    targets = [0.02] * 13 + [0.74] if fractions else None
    labels = metis_labels(matrix, 14, weights, target_fractions=targets)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert len(set(labels.tolist())) == 12 and all(0 <= label < 14 for label in labels)
    if fractions:
        assert labels[-1] == 13  # the heaviest vertex takes the part with the largest target


def test_a_regular_partition_still_goes_to_metis(capfd):
    # two dense blocks joined by one light edge: METIS cuts between them
    block = np.ones((4, 4))
    weights = np.block([[block, np.zeros((4, 4))], [np.zeros((4, 4)), block]])
    weights[3, 4] = 0.01
    labels = metis_labels(sp.csr_matrix(weights), 2, np.ones(8))
    assert len(set(labels[:4].tolist())) == 1 and len(set(labels[4:].tolist())) == 1
    assert labels[0] != labels[7]
    assert capfd.readouterr() == ("", "")
