"""The numpy out= aliasing checker."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.buffers import AliasError, check_out, no_alias, watch_numpy


def test_watch_numpy_flags_aliasing_calls_only():
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    b = np.ones((4, 4), np.float32)
    c = np.empty((4, 4), np.float32)
    with watch_numpy() as found:
        np.add(a, b, out=a)                        # element-wise in place: safe, not flagged
        np.exp(a, a)                               # positional out, element-wise: safe
        np.matmul(a, b, out=c)                     # separate output: fine
        np.matmul(a, b, out=a)                     # 1: alias-in-dispatch
        np.multiply(a[:, :2], 2.0, out=a[:, 1:3])  # 2: partial-overlap (shifted view)
        np.dot(a, b, out=b)                        # 3: alias-in-dispatch (x1)
        np.einsum("ij,jk->ik", a, c, out=c)        # 4: alias-in-dispatch (x1, after the subscripts)
        np.sum(a, axis=0, out=a[0])                # 5: partial-overlap
        s = np.add.reduce(a)                       # ufunc methods still work through the proxy
    assert [(f.kind, f.function, f.input) for f in found] == [
        ("alias-in-dispatch", "matmul", "x0"), ("partial-overlap", "multiply", "x0"),
        ("alias-in-dispatch", "dot", "x1"), ("alias-in-dispatch", "einsum", "x1"), ("partial-overlap", "sum", "x0")]
    assert all("test_buffers_numpy.py:" in f.where for f in found)
    assert "own buffer" in found[0].message and s.shape == (4,)
    assert isinstance(np.add, np.ufunc) and np.matmul.__class__ is np.ufunc  # restored on exit


def test_strict_watch_raises_at_the_call():
    a = np.ones((3, 3))
    with pytest.raises(AliasError, match="matmul"):
        with watch_numpy(strict=True):
            np.matmul(a, a, out=a)
    assert isinstance(np.matmul, np.ufunc)


def test_no_alias_decorator_for_python_kernels():
    @no_alias
    def attention(q, k, v, out=None):
        s = q @ k.T
        np.matmul(s, v, out=out)
        return out

    q = np.random.default_rng(0).standard_normal((4, 8))
    assert attention(q, q, q, out=np.empty_like(q)).shape == (4, 8)
    with pytest.raises(AliasError) as ei:
        attention(q, q, q, out=q)
    assert ei.value.finding.kind == "alias-in-dispatch" and ei.value.finding.input == "q"
    attention(q, q, q, out=q.copy())   # a copy shares no memory
    buf = np.zeros((5, 8))
    buf[:4] = q
    with pytest.raises(AliasError) as ei:
        attention(buf[:4], buf[:4], buf[:4], out=buf[1:])   # output one row down from the inputs
    assert ei.value.finding.kind == "partial-overlap"


def test_check_out_views():
    x = np.zeros(32, np.float32)
    assert check_out("k", [x[:16]], x[16:]) == []                  # disjoint halves
    assert [f.kind for f in check_out("k", [x[:16]], x[8:24])] == ["partial-overlap"]
    assert [f.kind for f in check_out("k", [x.reshape(4, 8)], x.reshape(4, 8).T)] == ["partial-overlap"]
    assert check_out("k", [x], x, elementwise=True) == []
    assert [f.kind for f in check_out("k", {"w": x}, (x,))] == ["alias-in-dispatch"]
