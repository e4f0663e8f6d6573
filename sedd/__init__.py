"""sedd: Score Entropy Discrete Diffusion (Lou, Meng & Ermon, ICML 2024) in JAX.

One module per concept of the paper:
  graphs    forward CTMC rate matrices Q (Absorbing, Uniform)
  noise     noise schedules sigma_bar(t) (Geometric, LogLinear)
  losses    denoising score entropy loss
  model     the DDiT transformer (Flax NNX)
  sampling  Euler (tau-leaping) and analytic (Tweedie) samplers
  data      TFDS builders, tokenizers, packing
  train     training loop, EMA, checkpoints
  sharding  device meshes and partition rules
  evaluate  likelihood bound, generative perplexity, entropy

and around them:
  categorical  categorical draws exact for small probabilities
  markov       synthetic Markov-chain data with an exact law
  ar           the autoregressive baseline (loss, KV-cache decoding)
  config       get_config() files and --config.x=y overrides
  bench        speed and memory benchmarks
  cli          the `sedd` command
"""

__version__ = "0.1.0"
