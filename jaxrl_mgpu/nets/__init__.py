"""Policy networks. `--policy mlp` is a feedforward actor-critic (with a small conv torso,
chosen automatically, for image observations such as MinAtar's)."""
