"""The one place networks are built from a config: the transformer (PPO's and DQN's
`--policy transformer`, AD's model, the bench's training step) and the feedforward ones."""

from __future__ import annotations

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.nets import compute_dtype, kernels
from jaxrl_mgpu.nets.mlp import MLP, ActorCritic, Critic, Critics
from jaxrl_mgpu.nets.qnet import QNetwork
from jaxrl_mgpu.nets.transformer import TransformerActorCritic


def is_sequence_policy(cfg) -> bool:
    """Whether the policy reads a history of steps (a transformer) rather than one observation."""
    return cfg.policy == "transformer"


def transformer(cfg, num_actions: int, obs_ndim: int, context_len: int | None = None,
                across_episodes: bool | None = None) -> TransformerActorCritic:
    """--d-model, --n-layers, --n-heads, --precision and the --attention / --mlp kernels;
    the context is --context-len (--context-across-episodes) unless given."""
    return TransformerActorCritic(
        num_actions=num_actions, obs_ndim=obs_ndim, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        context_len=cfg.context_len if context_len is None else context_len,
        context_across_episodes=cfg.context_across_episodes if across_episodes is None else across_episodes,
        dtype=compute_dtype(cfg.precision), **kernels(cfg))


def hidden_layers(cfg) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The actor's and the critic's hidden widths: --actor-hidden and --critic-hidden
    ("32,32,32,32"), each by default --num-layers x --hidden-size; a ConfigError (one line)
    for a list that is not positive whole numbers."""
    default = (cfg.hidden_size,) * cfg.num_layers
    return _widths("--actor-hidden", cfg.actor_hidden, default), _widths("--critic-hidden", cfg.critic_hidden, default)


def _widths(flag: str, text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if text is None:
        return default
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise ConfigError(f"{flag} {text!r}: give the hidden layers' widths as positive whole numbers separated by "
                          f"commas, e.g. 32,32,32,32")
    return widths


def actor_critic_mlp(cfg, num_outputs: int, obs_ndim: int, learned_log_std: bool) -> ActorCritic:
    """--actor-hidden / --critic-hidden (--hidden-size, --num-layers), --activation, --precision
    (a conv torso for images). `learned_log_std`: a Gaussian's state-independent log-std."""
    actor, critic = hidden_layers(cfg)
    return ActorCritic(num_outputs=num_outputs, obs_ndim=obs_ndim, actor_hidden=actor, critic_hidden=critic,
                       activation=cfg.activation, learned_log_std=learned_log_std, dtype=compute_dtype(cfg.precision))


def q_network(cfg, num_actions: int, obs_ndim: int) -> QNetwork:
    return QNetwork(num_actions=num_actions, obs_ndim=obs_ndim, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                    activation=cfg.activation, dtype=compute_dtype(cfg.precision))


def off_policy_nets(cfg, num_dims: int, critic_outputs: int) -> tuple[MLP, Critics]:
    """SAC's and TD3's actor (observation -> a tanh-normal's location and raw scale, 2 x
    `num_dims`) and their two critics (--critic-layer-norm), of --actor-hidden and
    --critic-hidden widths (--num-layers x --hidden-size by default), --activation and
    --precision."""
    actor, critic = hidden_layers(cfg)
    dtype = compute_dtype(cfg.precision)
    return (MLP(actor, 2 * num_dims, 0.01, cfg.activation, dtype),
            Critics(Critic(critic, critic_outputs, cfg.critic_layer_norm, cfg.activation, dtype)))
