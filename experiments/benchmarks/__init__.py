"""The benchmarks of sedd, one module each, run by ``bench.py`` (``python experiments/benchmarks/bench.py NAME``).

  train            tokens/s, FLOPs/token and MFU of the training step
  sampler          a sampler step against a plain forward pass
  diffusion_vs_ar  (`ar`) diffusion at each step count against the AR baseline
  block            AR, SEDD and block models writing N tokens
  bound            the likelihood bound of a batch, ddit against block models
  memory           the compiled train step's bytes a device, and a plan that fits
  rng              dropout masks and race words, JAX's bits against sedd.rng's
  optimizer        AdamW and Muon, with and without ZeRO-1
  step_profile     (`profile`) op time of a training step by kind
  decode           batch-1 decode, ms a network call
  speculative      an AR call's cost on n positions; drafters against AR
  gpu_summary      the table of gpu.sh's JSON files

``nets`` holds the configs and random networks they share; the timing rules
and helpers are ``experiments.timing``'s. ``serve_load.py``,
``idle_clients.py`` and ``vs_original.py`` are scripts of their own.
"""
