"""sedd: Score Entropy Discrete Diffusion (Lou, Meng & Ermon, ICML 2024) in JAX.

One module per concept of the paper: ``graphs`` (the rate matrices Q),
``noise`` (the schedules), ``losses`` (denoising score entropy), ``model``
(the DDiT; its block in ``ddit_layer``, its layers in ``layers``, its speed
paths in ``kernels``), ``sampling`` (the sampling core every kind drives and
the sampler registry), ``evaluate`` (the likelihood bound, exact NLL,
generative perplexity); around them ``kinds`` (ddit, ar, block, spec: each
kind's network, loss, figure and sampling; the causal LM the AR and spec
kinds share), ``speculative`` and ``drafts``, ``sdtt`` and ``distill``,
``data``, ``train``, ``runs``, ``figures``, ``config``, ``sharding``,
``convert``, ``serve`` and ``cli``. docs/architecture.md draws the rooms and
what each may import.
"""

__version__ = "0.1.0"
