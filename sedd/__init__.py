"""sedd: Score Entropy Discrete Diffusion (Lou, Meng & Ermon, ICML 2024) in JAX.

One module per concept of the paper:
  graphs    forward CTMC rate matrices Q (Absorbing, Uniform)
  noise     noise schedules sigma_bar(t) (Geometric, LogLinear)
  losses    denoising score entropy loss
  model     the DDiT transformer (Flax NNX)
  sampling  the sampling core ``run_loop`` every kind drives, the sampler
            registry (Euler, analytic, first-hitting, confidence, EB-sampler,
            ReMDM), one ``sample`` call returning ``Samples`` (a package)
  evaluate  likelihood bound, exact NLL, generative perplexity, entropy (pure)
  data      tokenizers, TFDS builders, packing, Markov data (a package)
  train     training loop, EMA, checkpoints
  sharding  device meshes and partition rules

and around them:
  kinds        model kinds (SEDD's ddit, the AR baseline, block diffusion): network, loss,
               figure, sampler, serving program
  block        block diffusion: the [x_t ; x_0] loss, the KV-cached block sampler
  ddit_block   the DDiT's transformer block and its decoding cache (a ring of keys and values)
  layers       the DDiT's building blocks: sigma and rotary embeddings, adaLN, its layers
  kernels      the model's speed paths: bfloat16 products, dtype policy, dropout masks
  categorical  categorical draws exact for small probabilities
  rng          random words from every bit of a threefry block
  ar           the autoregressive baseline (loss, KV-cache decoding)
  runs         a run directory; a trained model loaded for inference
  figures      a run's figures on a split; the judge of samples
  config       get_config() files, --config.x=y overrides, migration of old runs; the shipped ones in configs/
  convert      the original PyTorch checkpoints -> a run directory
  serve        `sedd serve`: completions server and playground (a package; no kind-specific code)
  cli          the `sedd` command

docs/architecture.md draws the rooms and what each may import.
"""

__version__ = "0.1.0"
