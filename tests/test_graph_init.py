"""The package surface: public names, typed errors, and no mlx or numpy on import."""

import subprocess
import sys

from forkv import graph
from forkv.graph import GraphError, NodeNotFound, NodeRemoved


def test_import_does_not_pull_mlx():
    code = (
        "import sys, forkv.graph, forkv.graph.testing; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('mlx', 'numpy', 'mlx_lm')]; "
        "assert not bad, bad; assert 'mlx' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_exist():
    assert len(graph.__all__) == len(set(graph.__all__))
    for name in graph.__all__:
        assert getattr(graph, name) is not None, name


def test_error_hierarchy():
    assert issubclass(GraphError, ValueError)
    assert issubclass(NodeNotFound, KeyError) and issubclass(NodeRemoved, NodeNotFound)
    e = NodeNotFound("node 'x' is missing; add it.", "x")
    assert str(e) == "node 'x' is missing; add it." and e.node_id == "x"
    for name in graph.__all__:
        obj = getattr(graph, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, GraphError), name
