"""Optimizer steps against values worked out by hand, and hyper-parameter validation."""
from __future__ import annotations

import numpy as np
import pytest

from autocnn.nn import RPROP, SGD, Adam, get_optimizer


def _run(opt, p0, grads):
    params = {"w": np.array(p0, dtype=np.float64)}
    history = []
    for g in grads:
        opt.step(params, {"w": np.array(g, dtype=np.float64)})
        history.append(params["w"].copy())
    return history


def test_sgd_plain_and_weight_decay():
    # p = 1, g = 0.5, lr 0.1: p = 1 - 0.05 = 0.95; with weight decay 0.01 the gradient is 0.51.
    assert _run(SGD(lr=0.1), [1.0], [[0.5]])[0] == pytest.approx([0.95])
    assert _run(SGD(lr=0.1, weight_decay=0.01), [1.0], [[0.5]])[0] == pytest.approx([0.949])


def test_sgd_momentum():
    # v1 = g = (0.5, -1): p = (0.95, -1.9); v2 = 0.9*v1 + g = (0.95, -1.9): p = (0.855, -1.71).
    steps = _run(SGD(lr=0.1, momentum=0.9), [1.0, -2.0], [[0.5, -1.0], [0.5, -1.0]])
    assert steps[0] == pytest.approx([0.95, -1.9])
    assert steps[1] == pytest.approx([0.855, -1.71])


def test_sgd_nesterov():
    # v1 = 0.5; update = g + 0.9*v1 = 0.95 -> p = 0.905; v2 = 0.95, update = 0.5 + 0.855 = 1.355 -> 0.7695.
    steps = _run(SGD(lr=0.1, momentum=0.9, nesterov=True), [1.0], [[0.5], [0.5]])
    assert steps[0] == pytest.approx([0.905])
    assert steps[1] == pytest.approx([0.7695])


def test_adam_two_steps():
    # Step 1 (g = 0.5): m_hat = 0.5, v_hat = 0.25, p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002.
    # Step 2 (g = -0.25): m = 0.9*0.05 - 0.025 = 0.02, v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225,
    # m_hat = 0.02/0.19 = 0.1052632, v_hat = 0.00031225/0.001999 = 0.1562031,
    # p = 0.900000002 - 0.1 * 0.1052632 / (0.3952253 + 1e-8) = 0.8733663.
    opt = Adam(lr=0.1)
    steps = _run(opt, [1.0], [[0.5], [-0.25]])
    assert steps[0] == pytest.approx([0.900000002], abs=1e-9)
    assert steps[1] == pytest.approx([0.8733663], abs=1e-7)
    assert opt.iterations == 2
    np.testing.assert_allclose(opt.state("w")["m"], [0.02])
    np.testing.assert_allclose(opt.state("w")["v"], [0.00031225])


def test_adam_weight_decay_adds_to_the_gradient():
    # The first Adam step moves by lr * sign(g + wd*p): with wd large enough, the sign flips.
    assert _run(Adam(lr=0.1, weight_decay=1.0), [1.0], [[-0.5]])[0] == pytest.approx([0.9], abs=1e-7)


def test_rprop_sign_changes():
    # Element 0 sees g = +1, +1, -1, -1, +1 with step_init 0.1:
    #  1: no previous gradient, step 0.1, p = -0.1
    #  2: same sign, step 0.12, p = -0.22
    #  3: sign flip, step 0.06, no move (gradient taken as 0), p = -0.22
    #  4: previous taken as 0, step stays 0.06, p = -0.22 + 0.06 = -0.16
    #  5: sign flip, step 0.03, no move
    # Element 1 sees g = 0 then always -2: step stays 0.1, then grows 0.12, 0.144, 0.1728 (capped at 0.15).
    # Element 2 keeps flipping: 0.1 -> 0.05 (no move) -> ... never below step_min 0.02.
    opt = RPROP(step_init=0.1, step_min=0.02, step_max=0.15)
    grads = [[1, 0, 1], [1, -2, -1], [-1, -2, 1], [-1, -2, -1], [1, -2, 1]]
    steps = _run(opt, [0.0, 0.0, 0.0], grads)
    expected_p0 = [-0.1, -0.22, -0.22, -0.16, -0.16]
    for t, p in enumerate(steps):
        assert p[0] == pytest.approx(expected_p0[t]), t
    # element 1: steps 0 (g=0), 0.1, 0.12, 0.144, 0.15 (capped) -> p = 0.1, 0.22, 0.364, 0.514
    assert [p[1] for p in steps] == pytest.approx([0.0, 0.1, 0.22, 0.364, 0.514])
    # element 2: t1 -0.1; t2 flip -> step 0.05, no move; t3 prev 0 -> move -0.05 ...
    assert [p[2] for p in steps] == pytest.approx([-0.1, -0.1, -0.15, -0.15, -0.175])
    np.testing.assert_allclose(opt.state("w")["step"], [0.03, 0.15, 0.025])


def test_rprop_keeps_the_step_above_step_min():
    # Flip, neutral (gradient taken as 0 after a flip), flip: 0.1 -> 0.05 -> 0.05 -> 0.025 ...
    flips = [[1], [-1], [1], [-1]]
    opt = RPROP(step_init=0.1, step_min=0.01)
    _run(opt, [0.0], flips)
    assert opt.state("w")["step"][0] == pytest.approx(0.025)
    # ... unless step_min is above 0.025.
    opt = RPROP(step_init=0.1, step_min=0.04)
    _run(opt, [0.0], flips)
    assert opt.state("w")["step"][0] == pytest.approx(0.04)


def test_updates_are_in_place_and_keep_float32():
    p = np.ones(3, dtype=np.float32)
    params = {"w": p}
    for opt in (SGD(lr=0.1, momentum=0.9), Adam(), RPROP()):
        opt.step(params, {"w": np.full(3, 0.5, dtype=np.float32)})
        assert params["w"] is p and p.dtype == np.float32
    assert np.all(p < 1)


def test_gradient_buffers_are_not_modified():
    g = np.array([0.5, -0.5])
    SGD(lr=0.1, momentum=0.9, weight_decay=0.1).step({"w": np.ones(2)}, {"w": g})
    Adam(weight_decay=0.1).step({"w": np.ones(2)}, {"w": g})
    np.testing.assert_array_equal(g, [0.5, -0.5])


def test_step_checks_the_parameter_set():
    opt = SGD(lr=0.1)
    opt.setup({"a": np.zeros(2)})
    with pytest.raises(ValueError, match="setup"):
        opt.step({"b": np.zeros(2)}, {"b": np.zeros(2)})
    with pytest.raises(ValueError, match="'a'"):
        opt.step({"a": np.zeros(3)}, {"a": np.zeros(3)})


@pytest.mark.parametrize("make,name", [
    (lambda: SGD(lr=0), "lr"),
    (lambda: SGD(lr=-1), "lr"),
    (lambda: SGD(lr=float("nan")), "lr"),
    (lambda: SGD(lr=0.1, momentum=1.0), "momentum"),
    (lambda: SGD(lr=0.1, weight_decay=-0.1), "weight_decay"),
    (lambda: SGD(lr=0.1, nesterov=True), "nesterov"),
    (lambda: Adam(beta1=1.0), "beta1"),
    (lambda: Adam(beta2=-0.1), "beta2"),
    (lambda: Adam(eps=0), "eps"),
    (lambda: RPROP(eta_plus=1.0), "eta_plus"),
    (lambda: RPROP(eta_minus=1.5), "eta_minus"),
    (lambda: RPROP(step_min=0.1, step_init=0.01), "step_min"),
    (lambda: RPROP(step_max=-1), "step_max"),
])
def test_invalid_hyper_parameters(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_get_optimizer():
    assert isinstance(get_optimizer("adam"), Adam)
    sgd = get_optimizer("SGD", lr=0.5)
    assert isinstance(sgd, SGD) and sgd.lr == 0.5 and sgd.momentum == 0.9
    assert isinstance(get_optimizer("rprop"), RPROP)
    with pytest.raises(ValueError, match="rprop has no learning rate"):
        get_optimizer("rprop", lr=0.1)
    with pytest.raises(ValueError, match="adam, sgd|sgd, adam"):
        get_optimizer("adagrad")
