"""The default: a character-level model of the embedded Shakespeare plays.

Sized to train on 2 CPU cores in minutes (1,500 steps of 32 x 128 characters,
1.05M parameters, Muon for the layers' matrices, the network's output a
distribution over the clean letter (MDLM's SUBS), `sedd train` running one
device a core; the README gives the times measured on CPUs with and without
AVX512-BF16). The validation bound falls to ~2.69 bits/char, against 4.81
for the unigram law, and samples are word-like pseudo-verse. The same
settings learn text whose structure is all in the context (an order-2
Markov chain) to within 0.3 bits/char of its entropy rate, and their
samples, drawn the surest positions first (the EB-sampler), score within
0.3 nats/char of it under the chain.
docs/default_run.md has the study behind these settings."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """The default config: a character-level DDiT of the bundled plays."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # drives initialisation, data order, t and x_t draws, sampling

    c.model = ml_collections.ConfigDict()
    # "ddit" (diffusion), "ar" (causal baseline), "block" (block diffusion), "spec" (self-speculation)
    c.model.kind = "ddit"
    c.model.block_size = 16  # "block": tokens per block, a divisor of data.seq_len
    # "block": position p reads the token at p - 1 (BOS at 0), as an AR network does (Fast-dLLM v2's shift), so that
    # an AR run's weights start it (training.init_from); at b = 1 the network is an AR network
    c.model.token_shift = False
    c.model.draft_k = 4  # "spec", and "ar" with a draft head: drafts a round, what the network learns (4 is good)
    c.model.draft_head = 0  # "ar": N > 0 a draft head of width N drafts for it (sedd.kinds.draft_head); 0 none
    c.model.hidden_size = 128  # H, the width of the residual stream
    c.model.n_layers = 4  # transformer layers
    c.model.n_heads = 8  # attention heads; H / n_heads must be even (rotary)
    c.model.cond_dim = 64  # width of the sigma conditioning vector
    c.model.mlp_ratio = 4  # MLP hidden width as a multiple of H
    c.model.dropout = 0.0  # residual dropout; SEDD uses 0.1 at scale
    c.model.scale_by_sigma = True  # absorbing graph: SEDD's log(e^sigma - 1) output offset
    c.model.time_conditioning = True  # False: no sigma input (RADD; absorbing graph with scale_by_sigma)
    # True: the network predicts p(x0 | x_t) (absorbing: MDLM SUBS; uniform: DUO); False: SEDD's score
    c.model.normalize = True
    # what a layer's backward keeps: "none" (all), "dots" (weight matmul outputs), "layers" (its input)
    c.model.remat = "none"
    c.model.vocab_multiple = 1  # pad the embedding rows and output columns to a multiple (128: splittable by a mesh)
    # compute dtype: "auto" (bfloat16 where it runs fast: GPU, TPU, AVX512-BF16 CPU), "float32", "bfloat16"
    c.model.dtype = "auto"

    c.graph = ml_collections.ConfigDict()
    c.graph.type = "absorbing"  # "absorbing" (mask) or "uniform"

    c.noise = ml_collections.ConfigDict()
    c.noise.type = "loglinear"  # "loglinear" or "geometric"
    c.noise.eps = 1e-3  # loglinear: sigma_bar(1) = -log(eps)
    c.noise.sigma_min = 1e-4  # geometric: sigma_bar(0)
    c.noise.sigma_max = 20.0  # geometric: sigma_bar(1)

    c.data = data_section()  # the text, its documents, its tokenizer, its length

    c.training = ml_collections.ConfigDict()
    c.training.batch_size = 32  # global batch, summed over all devices and hosts
    c.training.n_iters = 1500  # batches to train on
    c.training.accum_steps = 1  # batches per optimizer update (optax.MultiSteps)
    c.training.loss_chunk = 0  # >0: the output layer and loss this many positions at a time (no [B, L, V] array)
    c.training.draft_weight = 1.0  # "spec" and a draft head: the weight of the drafts' cross-entropy beside the NLL
    # "spec" and a draft head: drafts learn the text ("data"), the causal LM's laws on it ("causal"), or its laws on
    # text it writes each step ("own": on-policy; each step also writes a batch, token by token: sedd.kinds.spec.loss)
    c.training.draft_target = "data"
    # a run's directory whose EMA weights start this run (read at step 0 only): a run of this kind and size, or an
    # AR run of this size for a block run with model.token_shift (docs/block_diffusion.md, "From an AR run")
    c.training.init_from = ""
    c.training.sampling_eps = 1e-3  # t ~ U[sampling_eps, 1]
    c.training.low_discrepancy = False  # stratified t over the batch (VDM/MD4); off as in SEDD
    c.training.t_power = 0.5  # t ~ t^-p with importance weights (losses.sample_times); 0: uniform, as SEDD
    c.training.ema = 0.98  # EMA decay cap; decay = min(ema, (1 + n) / (10 + n)); ~50 steps at the end of a cosine run
    c.training.log_every = 50  # steps between metrics.jsonl lines
    c.training.eval_every = 500  # steps between validation bounds and samples
    c.training.ckpt_every = 500  # steps between checkpoints
    c.training.max_to_keep = 2  # checkpoints kept (the newest)
    c.training.keep_period = 0  # also keep every step divisible by this (0 = none)
    c.training.eval_batches = 8  # validation batches per evaluation
    c.training.eval_samples = 2  # samples printed at each evaluation

    c.optim = ml_collections.ConfigDict()
    c.optim.optimizer = "muon"  # "muon": the layers' matrices by Muon, the rest by AdamW; "adamw": all by AdamW (SEDD)
    c.optim.muon_lr_scale = 4.0  # Muon's learning rate as a multiple of lr (its updates have AdamW's RMS at 1.0)
    c.optim.lr = 2e-3  # peak learning rate (AdamW's, and the schedule's)
    c.optim.beta1 = 0.9  # AdamW
    c.optim.beta2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.0
    c.optim.warmup = 100  # linear warmup, in optimizer updates
    c.optim.schedule = "cosine"  # after warmup: "constant" or "cosine" (to 10% of lr)
    c.optim.grad_clip = 1.0  # clip by global norm (0 = off)
    c.optim.adaln_lr_scale = 0.1  # lr multiplier of the adaLN modulation kernels (1.0 = the original SEDD)

    c.sampling = ml_collections.ConfigDict()
    # the surest positions first (EB-sampler; absorbing graph only), or any name in sedd.sampling.SAMPLERS:
    # "analytic" (SEDD's Tweedie tau-leaping; also on the uniform graph), "euler", "first_hitting", ...
    c.sampling.sampler = "entropy_bound"
    c.sampling.steps = 128  # reverse steps
    c.sampling.categorical = "precise"  # "precise" (exact small probabilities) or "gumbel32"
    c.sampling.eps = 1e-5  # the last time of the reverse grid
    c.distill = distill_section()  # written by `sedd distill`; rounds = 0: a run `sedd train` wrote

    c.mesh = mesh_section()  # the devices and how the arrays are split over them
    return c


def data_section() -> ml_collections.ConfigDict:
    """The data section: the plays, read as characters, 128 a sequence (and the Markov and code corpora's keys)."""
    d = ml_collections.ConfigDict()
    d.name = "shakespeare"  # shakespeare | text | text8 | openwebtext | tinystories | code | markov
    d.path = ""  # a local file or folder ("" = the default); with name "shakespeare" it trains on your text
    d.documents = "file"  # a .txt file holds: file = one document | lines = one per line | paragraphs
    d.tokenizer = "char"  # char | byte | gpt2
    d.tokenizer_path = ""  # gpt2 only: tokenizer.json, or a folder with vocab.json + merges.txt
    d.seq_len = 128  # L, tokens per training sequence
    d.data_dir = ""  # "" = $SEDD_DATA_DIR, else ~/tensorflow_datasets
    d.markov = ml_collections.ConfigDict()  # read only when data.name = "markov" (sedd.data.markov)
    d.markov.vocab_size = 8  # V, tokens of the synthetic chain
    d.markov.order = 2  # k, tokens of context of each transition
    d.markov.seed = 0  # seeds the transition table (the chain itself)
    d.markov.alpha = 0.3  # Dirichlet concentration of each row: small = peaked, low entropy
    d.markov.num_tokens = 500_000  # tokens in the train split (validation, test: 1/20 each)
    # data.name = "code" only (sedd.data.sources): tests = take test files too; glob = the pattern of the files;
    # a file over max_file_bytes is skipped with a note, a corpus over max_bytes refused (docs/code.md)
    d.code = ml_collections.ConfigDict(
        {"tests": False, "glob": "*.py", "max_file_bytes": 4 << 20, "max_bytes": 1 << 30}
    )
    return d


def distill_section() -> ml_collections.ConfigDict:
    """The distill section: what `sedd distill` (sedd.distill) fills in, and its own settings."""
    d = ml_collections.ConfigDict()
    d.teacher = ""  # the teacher's run directory (absolute)
    d.teacher_step = -1  # the teacher's checkpoint distilled (-1: its newest, recorded when read)
    d.teacher_steps = 0  # N0: the teacher's sampling steps that round 1 halves (0: its sampling.steps)
    d.rounds = 0  # R: rounds, each halving the steps; the student samples with N0 / 2^R
    d.round_steps = 500  # training steps a round
    d.divergence = "kl_backward"  # between the teacher's two steps and the student's one: sedd.sdtt.DIVERGENCES
    d.target = "x0"  # "x0": SDTT's, the teacher's second-step denoiser; "law": its two-step law (sedd.sdtt.TARGETS)
    # the positions a step writes: "random" (the analytic sampler's, at the schedule's rate) or "dilated" (a
    # planned order, the 'dilated' sampler; SEDD runs): sedd.distill.ORDERS
    d.order = "random"
    return d


def mesh_section() -> ml_collections.ConfigDict:
    """The mesh section: the devices' axes, the sharding rules, and the processes of a distributed job."""
    m = ml_collections.ConfigDict()
    m.data = -1  # devices along the data axis (-1: all that remain)
    m.fsdp = 1  # parameter sharding (ZeRO-3 style) axis
    m.tensor = 1  # tensor (model) parallel axis
    # Overrides of sedd.sharding.DEFAULT_RULES: pairs (logical axis name, mesh
    # axis or tuple of mesh axes or None), e.g. (("embed", None), ("mlp", "fsdp")).
    m.rules = ()
    m.distributed = "auto"  # jax.distributed: "auto" (when the environment is a multi-process job), "on", "off"
    m.coordinator_address = ""  # host:port of process 0; "" = detected by jax (SLURM, MPI, TPU, env)
    m.cpu_devices = 0  # sedd train on a CPU: this many devices (0 = auto: one a core; sedd.sharding.split_cpu)
    m.num_processes = 0  # processes in the job; 0 = detected by jax
    m.process_id = -1  # this process's index; -1 = detected by jax
    return m
