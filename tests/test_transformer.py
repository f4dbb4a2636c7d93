"""The transformer actor-critic: acting (KV cache, one step at a time) == learner (sequences),
episode / causal / window masking, reduced precision, and a benchmark-sized build."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from jaxrl_mgpu.nets.transformer import TransformerActorCritic

A, OBS, C = 3, 5, 8          # actions, observation size, context_len
B, N = 4, 3 * C              # environments, steps in the stream
# Episode starts per environment: several boundaries, episodes longer than C, an episode that
# starts mid-stream after an unflagged beginning, and a stream with no start at all.
STARTS = [(0, 3, 15), (0, 10, 11, 20), (5,), ()]


def make(n_layers=2, **kw):
    return TransformerActorCritic(num_actions=A, obs_ndim=1, d_model=32, n_layers=n_layers, n_heads=4,
                                  context_len=C, **kw)


def make_stream(seed=0, steps=N, starts=STARTS):
    return helpers.make_stream(starts, steps, A, OBS, seed)


def random_params(model, seed=0):
    return helpers.random_transformer_params(model, OBS, seed)


def act(model, params, xs, cache=None):
    """The acting path: `step` scanned over the stream. Returns per-step log-probs [B, T, A],
    values [B, T] and the cache BEFORE each step (leaves [T, B, ...]) plus the final one."""
    cache = model.init_cache(xs[0].shape[0]) if cache is None else cache

    def body(cache, x):
        logits, value, new = model.apply(params, cache, *x, method=model.step)
        return new, (jax.nn.log_softmax(logits), value, cache)

    final, (logp, values, caches) = jax.lax.scan(body, cache, jax.tree.map(lambda x: x.swapaxes(0, 1), xs))
    return logp.swapaxes(0, 1), values.swapaxes(0, 1), caches, final


def learn(model, params, cache, xs, valid=None):
    logits, values, new = model.apply(params, cache, *xs, valid=valid)
    return jax.nn.log_softmax(logits), values, new


act_jit = jax.jit(act, static_argnums=0)
apply_jit = jax.jit(lambda model, params, xs: model.apply(params, None, *xs), static_argnums=0)
learn_jit = jax.jit(learn, static_argnums=0)


def close(a, b, atol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


def caches_equal(a, b):
    close(a.valid, b.valid, 0)
    close(a.pos, b.pos, 0)
    # Entries that are not valid may hold stale keys; only the valid ones must agree.
    for x, y in zip(a.k + a.v, b.k + b.v):
        m = np.asarray(a.valid)[:, :, None, None]
        close(np.where(m, x, 0), np.where(m, y, 0))


def take(tree, t0, t1=None):
    return jax.tree.map(lambda x: x[:, t0:t1], tree)


@pytest.mark.slow
@pytest.mark.parametrize("across", [False, True])
def test_acting_equals_learner(across):
    model = make(context_across_episodes=across)
    params = random_params(model)
    xs = make_stream()
    logp, values, caches, final = act_jit(model, params, xs)

    # Whole stream from scratch.
    lp, v, new = learn_jit(model, params, None, xs)
    close(lp, logp), close(v, values)
    caches_equal(new, final)

    # Starting mid-stream from the actor's cache at t0 (what a PPO learner stores; t0 = 0 is the
    # empty cache), for sequences shorter and longer than the context (one shape each, to keep
    # compiles few).
    for t0, t1 in [(0, 13), (4, 17), (11, 24), (9, 12), (21, 24)]:
        cache_t0 = jax.tree.map(lambda x: x[t0], caches)
        lp, v, new = learn_jit(model, params, cache_t0, take(xs, t0, t1))
        close(lp, logp[:, t0:t1]), close(v, values[:, t0:t1])
        caches_equal(new, final if t1 == N else jax.tree.map(lambda x: x[t1], caches))

    # Raw history instead of the cache: n_layers * (C - 1) earlier tokens are needed; steps
    # before the stream began are padding (valid=False).
    hist, length = model.n_layers * (C - 1), 8
    for t0 in (9, 16):
        pad = max(0, hist - t0)
        seq = jax.tree.map(lambda x: jnp.concatenate([jnp.zeros_like(x[:, :pad]), x[:, t0 + pad - hist:t0 + length]], 1), xs)
        valid = jnp.broadcast_to(jnp.arange(hist + length) >= pad, (B, hist + length))
        lp, v, _ = learn_jit(model, params, None, seq, valid)
        close(lp[:, hist:], logp[:, t0:t0 + length]), close(v[:, hist:], values[:, t0:t0 + length])


@pytest.mark.slow
def test_cache_vmaps_over_a_leading_axis():
    """Caches of several devices/groups stacked on a leading axis: vmap(step) == step per group."""
    model = make()
    params = random_params(model)
    xs = make_stream()
    _, _, caches, _ = act_jit(model, params, xs)
    stacked = jax.tree.map(lambda x: jnp.stack([x[7], x[13]]), caches)
    x = jax.tree.map(lambda y: jnp.stack([y[:, 7], y[:, 13]]), xs)
    step = lambda c, *inp: model.apply(params, c, *inp, method=model.step)
    out = jax.jit(jax.vmap(step))(stacked, *x)
    step = jax.jit(step)
    for g in range(2):
        ref = step(jax.tree.map(lambda y: y[g], stacked), *(y[g] for y in x))
        close(out[0][g], ref[0]), close(out[1][g], ref[1])


def outputs(model, params, xs):
    logits, values, _ = apply_jit(model, params, xs)
    return np.concatenate([np.asarray(logits), np.asarray(values)[..., None]], -1)[0]  # [T, A+1]


def perturb(xs, t, field=0):
    xs = list(xs)
    xs[field] = xs[field].at[:, t].add(1)
    if field == 1:
        xs[field] %= A
    return tuple(xs)


def changed(a, b):
    return np.abs(a - b).max(-1) > 1e-4  # [T] bool


@pytest.mark.slow
@pytest.mark.parametrize("across", [False, True])
def test_episode_boundary(across):
    model = make(context_across_episodes=across)
    params = random_params(model)
    xs = make_stream(starts=[(0, 10)])
    base = outputs(model, params, xs)
    diff = changed(base, outputs(model, params, perturb(xs, 7)))  # obs in the previous episode
    assert not diff[:7].any() and diff[7:10].all()
    if across:
        assert diff[10:14].all()       # seen through the window
    else:
        assert not diff[10:].any()     # never crosses the boundary
    # prev_action / prev_reward at an episode start are ignored (zeroed)
    for field in (1, 2):
        assert not changed(base, outputs(model, params, perturb(xs, 10, field))).any()


def test_causal():
    model = make()
    params = random_params(model)
    xs = make_stream(starts=[(0,)])
    diff = changed(outputs(model, params, xs), outputs(model, params, perturb(xs, 12)))
    assert not diff[:12].any() and diff[12]


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("across", [False, True])
def test_window(n_layers, across):
    """Each layer sees the last C tokens, so the output at t depends on tokens back to
    t - n_layers * (C - 1) and on nothing earlier."""
    model = make(n_layers=n_layers, context_across_episodes=across)
    params = random_params(model)
    xs = make_stream(starts=[(0,)])
    t, reach = 3, n_layers * (C - 1)
    diff = changed(outputs(model, params, xs), outputs(model, params, perturb(xs, t)))
    assert not diff[:t].any()
    assert diff[t] and diff[t + reach]
    assert not diff[t + reach + 1:].any()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_reduced_precision(dtype):
    if dtype == jnp.float16 and jax.default_backend() == "cpu":
        pytest.skip("XLA:CPU has no F16_F16_F32 dot, which jax's XLA attention asks for in float16")
    model = make(dtype=dtype)
    params = random_params(model)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    xs = make_stream()
    logp, values, _, final = act_jit(model, params, xs)
    lp, v, new = learn_jit(model, params, None, xs)
    assert final.k[0].dtype == dtype and new.k[0].dtype == dtype
    for x in (logp, values, lp, v):
        assert x.dtype == jnp.float32 and bool(jnp.isfinite(x).all())
    # Same computation in another order: equal up to the compute dtype's rounding.
    close(lp, logp, atol=0.1), close(v, values, atol=0.1)
    # ... and near the float32 model with the same params.
    lp32, v32, _ = learn_jit(make(), params, None, xs)
    close(lp, lp32, atol=0.2), close(v, v32, atol=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tokens_are_the_embedding_dense(dtype):
    """The token embedding folds its bias into the matmul (a ones column): the same tokens as
    the flax Dense it holds the parameters of, within the compute dtype's rounding."""
    model = make(dtype=dtype)
    params = random_params(model)
    xs = make_stream()[:4]  # obs, previous action, previous reward, is_first
    tokens = model.apply(params, *xs, method=model._tokens)
    dense = model.apply(params, *xs, method=lambda m, *x: m.embed(m._token_features(*x)))
    assert tokens.dtype == dense.dtype == dtype and tokens.shape == (B, N, 32)
    close(tokens.astype(jnp.float32), dense.astype(jnp.float32), atol=1e-5 if dtype == jnp.float32 else 0.05)


@pytest.mark.slow
def test_benchmark_size_builds_and_jits():
    """The MFU benchmark's shape (bf16) compiles and runs on both paths. Params come from
    eval_shape (the real init of 19M params is the same code as above, and slow on CPU)."""
    model = TransformerActorCritic(num_actions=6, obs_ndim=1, d_model=512, n_layers=6, n_heads=8,
                                   context_len=256, dtype=jnp.bfloat16)
    batch, length = 2, 16
    xs = (jnp.ones((batch, length, 40)), jnp.zeros((batch, length), jnp.int32), jnp.ones((batch, length)),
          jnp.zeros((batch, length), bool))
    shapes = jax.eval_shape(model.init, jax.random.key(0), None, *xs)
    assert 18e6 < sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)) < 20e6
    params = jax.tree.map(lambda x: jnp.full(x.shape, 0.01, x.dtype), shapes)
    logits, values, cache = jax.jit(model.apply)(params, model.init_cache(batch), *xs)
    step = jax.jit(lambda p, c, *x: model.apply(p, c, *x, method=model.step))
    logits1, value1, cache = step(params, cache, *(x[:, 0] for x in xs))
    assert logits.shape == (batch, length, 6) and values.shape == (batch, length)
    assert logits1.shape == (batch, 6) and value1.shape == (batch,) and logits1.dtype == jnp.float32
    assert cache.k[0].shape == (batch, 256, 8, 64) and int(cache.pos[0]) == length + 1
    assert bool(jnp.isfinite(logits).all() & jnp.isfinite(logits1).all())


@pytest.mark.slow
def test_peek_equals_step_without_touching_the_cache():
    model = TransformerActorCritic(num_actions=3, obs_ndim=1, d_model=32, n_layers=2, n_heads=4, context_len=5)
    B = 4
    obs = jax.random.normal(jax.random.PRNGKey(1), (12, B, 3))
    params = model.init(jax.random.PRNGKey(0), None, obs[:1].swapaxes(0, 1), jnp.zeros((B, 1), jnp.int32),
                        jnp.zeros((B, 1)), jnp.ones((B, 1), bool))
    params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(jax.random.PRNGKey(2), p.shape), params)
    cache = model.init_cache(B)
    peek = jax.jit(lambda cache, *args: model.apply(params, cache, *args, method=model.peek))
    step = jax.jit(lambda cache, *args: model.apply(params, cache, *args, method=model.step))
    for t in range(12):  # past the window, with an episode start in env 1 at t = 7
        first = jnp.array([t == 0, t in (0, 7), t == 0, False])
        args = (obs[t], jnp.full((B,), t % 3), jnp.full((B,), 0.5 * t), first)
        peek_logits, peek_value = peek(cache, *args)
        logits, value, cache = step(cache, *args)
        np.testing.assert_allclose(peek_logits, logits, atol=1e-5)
        np.testing.assert_allclose(peek_value, value, atol=1e-5)
