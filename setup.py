"""Install the distribution sedd-jax: the `sedd` package and command (Score Entropy Discrete Diffusion in JAX)."""

from setuptools import find_packages, setup

setup(
    name="sedd-jax",  # the import name and the command are `sedd`; PyPI's `sedd` is an unrelated project
    version="0.1.0",
    description="Score Entropy Discrete Diffusion (Lou, Meng & Ermon 2024) in JAX/Flax.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["sedd", "sedd.*"]),
    # The packages' root named: `pip install -e .` then puts the clone on sys.path (setuptools' "static .pth"
    # editable install) instead of an import hook that runs after Python's own search. With the hook, the clone
    # folder itself (named `sedd`, as `git clone` names it) was imported as an empty namespace package from the
    # folder above it, ahead of the real one: `python snippet.py` there failed (issue 84).
    package_dir={"": "."},
    # The default corpus and the zero-shot text (see sedd/data/corpus/README.md) and the configs
    # (modules of sedd.configs, found by name) ship inside the package.
    package_data={"sedd.data": ["corpus/*.tar.xz", "corpus/*.txt", "corpus/README.md"], "sedd": ["static/*.html"]},
    # Ranges tested on these machines: jax 0.10.2, flax 0.12.8, optax 0.2.8,
    # orbax-checkpoint 0.12.8, tensorflow-datasets 4.9.10, ml-collections 1.1.0.
    install_requires=[
        "jax>=0.10,<0.11",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "tensorflow-datasets>=4.9.10,<5",
        "array_record>=0.8",  # TFDS's array_record file format, read without TensorFlow
        "ml-collections>=1.1,<2",
        "numpy>=2",
        "tqdm>=4.66",  # progress bars
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",  # the README's test command runs two workers (-n 2)
            "scipy>=1.13",
            "matplotlib>=3.8",
            "jupytext>=1.16",
            "tokenizers>=0.20",
            "safetensors>=0.4",
            "pyyaml>=6",
            "starlette>=0.37",
            "pydantic>=2.4",
            "uvicorn[standard]>=0.30",
            "sse-starlette>=2",
            "openai>=1.40",
            "httpx>=0.27",
            "selenium>=4.20",  # the playground test drives Debian's chromium (installed by .ci/run)
            "wheel",  # builds the wheel offline in tests/test_runs.py
            "ruff==0.17.6",  # .ci/run: `ruff check` and `ruff format --check` (pinned: a new ruff may reformat)
        ],
        "gpt2": ["tokenizers>=0.20"],  # GPT-2 BPE from local vocabulary files
        "convert": ["pyyaml>=6", "tokenizers>=0.20"],  # sedd convert (no torch; safetensors read by our own reader)
        # sedd serve: a bare Starlette app (FastAPI's layers cost ~18% of the requests/s), httptools (2.3x h11's)
        "serve": ["starlette>=0.37", "pydantic>=2.4", "uvicorn[standard]>=0.30", "sse-starlette>=2"],
        # One GPU: jax's CUDA 12 wheels with the flax of the CPU-tested pair. Pinned because not every
        # pair imports: flax 0.12.8 fails under jax 0.11.2 (`jax.experimental.hijax` has no
        # `HiPrimitive`); jax 0.10.2 + flax 0.12.8 (this pin, the test suite's) and jax 0.11.2 + flax
        # 0.12.10 (an H200 image's) import and run. tests/test_gpu_script.py checks the pins.
        "gpu": ["jax[cuda12]==0.10.2", "flax==0.12.8"],
        "plot": ["matplotlib>=3.8"],
    },
    entry_points={"console_scripts": ["sedd = sedd.cli:main"]},
)
