"""sedd: Score Entropy Discrete Diffusion (Lou, Meng & Ermon, ICML 2024) in JAX.

One module per concept of the paper:
  graphs    forward CTMC rate matrices Q (Absorbing, Uniform)
  noise     noise schedules sigma_bar(t) (Geometric, LogLinear)
  losses    denoising score entropy loss
  model     the DDiT transformer (Flax NNX)
  sampling  Euler (tau-leaping) and analytic (Tweedie) samplers
  data      tokenizers, TFDS builders, packing, Markov data (a package)
  train     training loop, EMA, checkpoints
  sharding  device meshes and partition rules
  evaluate  likelihood bound, generative perplexity, entropy

and around them:
  categorical  categorical draws exact for small probabilities
  ar           the autoregressive baseline (loss, KV-cache decoding)
  runs         a run directory; a trained model loaded for inference
  config       get_config() files and --config.x=y overrides; the shipped ones in configs/
  cli          the `sedd` command
"""

__version__ = "0.1.0"
