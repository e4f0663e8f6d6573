"""MDLM's Hugging Face config (kuleshov-group/mdlm-owt), the format BD3-LM and DUO share -> our config.

All three are SEDD's DDiT under "backbone." (docs/pretrained.md, section 6):
MDLM the absorbing graph with SUBS, BD3-LM the same in blocks
(`sedd.convert.bd3lm`), DUO the uniform graph (`sedd.convert.duo` reads its
Lightning checkpoint into these fields).
"""

from __future__ import annotations

from typing import Mapping

import ml_collections

from sedd.convert.bd3lm import BD3LM_FIELDS, block_size_of
from sedd.convert.fields import GPT2_TOKENS, SIZE_BOUNDS, ddit_config, field
from sedd.convert.limits import ConversionError

# A Hugging Face config.json's fields that load code or describe the file, not the model: dropped on reading.
HF_METADATA = frozenset(
    {"architectures", "auto_map", "transformers_version", "torch_dtype", "return_dict", "_name_or_path"}
)
# transformers' own PretrainedConfig attributes, which save_pretrained may write for any model (4.56 and later
# write `dtype`, the new name of torch_dtype): not fields of the model; dropped with a note on reading.
HF_GENERIC = frozenset(
    {
        "dtype",
        "use_bfloat16",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "tie_word_embeddings",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "chunk_size_feed_forward",
        "pruned_heads",
        "id2label",
        "label2id",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "pad_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "finetuning_task",
        "tf_legacy_loss",
        "use_cache",
        "_attn_implementation_autoset",
        "cross_attention_hidden_size",
    }
)
# Our model's sizes (`fields.SIZE_BOUNDS`' keys, and DUO's Hydra model.* names) -> their config.json fields.
HF_SIZES = {
    "hidden_size": "hidden_dim",
    "n_blocks": "n_blocks",
    "n_heads": "n_heads",
    "cond_dim": "cond_dim",
    "length": "model_length",
}
# The model fields of kuleshov-group's published configs (MDLMConfig, BD3LMConfig), by model_type.
HF_FIELDS = {*HF_SIZES.values(), "vocab_size", "dropout", "time_conditioning", "model_type"}
PEERS = {"mdlm": HF_FIELDS, "duo": HF_FIELDS, "bd3lm": HF_FIELDS | BD3LM_FIELDS}
PEER_PREFIX = "backbone."  # the backbone's tensors inside MDLM's and BD3-LM's published state dicts


def config_from_peer(orig: Mapping, tokenizer_path: str, dtype: str) -> ml_collections.ConfigDict:
    """Our config of MDLM's (kuleshov-group/mdlm-owt), BD3-LM's (bd3lm-owt-block_size*) or DUO's model.

    orig: a Hugging Face config.json (MDLM, BD3-LM), or the same fields read
    from a DUO Lightning checkpoint (`sedd.convert.duo.lightning_source`).
    All three are SEDD's DDiT with the log-linear schedule (eps 1e-3) over
    GPT-2's tokenizer. MDLM and BD3-LM: the absorbing graph over GPT-2's 50,257
    tokens + MASK (id 50,257), the output MDLM's SUBS (``model.normalize`` with
    ``scale_by_sigma``); BD3-LM is our block kind (``sedd.kinds.block``) over [x_t ;
    x_0] with its block size (`sedd.convert.bd3lm.block_size_of`). DUO: the
    uniform graph over GPT-2's tokens + its [PAD], the output x0's law
    (``model.normalize`` without ``scale_by_sigma``).
    """
    family = orig["model_type"]
    unknown = sorted(set(orig) - PEERS[family])
    if unknown:
        raise ConversionError(f"unknown field(s) {unknown} in the {family} config.json; known: {sorted(PEERS[family])}")
    vocab = field(orig, "", "vocab_size", int)
    if vocab != GPT2_TOKENS + 1:
        raise ConversionError(
            f"vocab_size = {vocab} in the {family} config.json; its published models are "
            f"GPT-2's {GPT2_TOKENS} tokens + MASK = {GPT2_TOKENS + 1}"
        )
    sizes = {ours: field(orig, "", theirs, int) for ours, theirs in HF_SIZES.items()}
    for key, value in sizes.items():
        if not 1 <= value <= SIZE_BOUNDS[key]:
            raise ConversionError(
                f"{HF_SIZES[key]} = {value} in the {family} config.json is outside [1, {SIZE_BOUNDS[key]}]"
            )
    hidden, heads = sizes["hidden_size"], sizes["n_heads"]
    if hidden % heads or (hidden // heads) % 2:
        raise ConversionError(f"hidden_dim = {hidden} and n_heads = {heads} give no even head size")
    time_conditioning = field(orig, "", "time_conditioning", bool)
    if family == "duo" and not time_conditioning:
        raise ConversionError(
            "algo.time_conditioning = false in the duo config: a uniform-state network "
            "needs sigma (DUO trains with true)"
        )
    block = block_size_of(orig, sizes["length"], time_conditioning) if family == "bd3lm" else 0
    dropout = field(orig, "", "dropout", float)
    if not 0.0 <= dropout < 1.0:
        raise ConversionError(f"dropout = {dropout} in the {family} config.json must be in [0, 1)")
    c = ddit_config(sizes, dropout, dtype, tokenizer_path)
    if block:
        c.model.kind, c.model.block_size = "block", block
    # MDLM, BD3-LM: SUBS, a log-softmax over the tokens (the MASK logit is never a prediction); DUO: a
    # log-softmax over all V = 50,258 ids (GPT-2's + its [PAD], every one a state of the uniform graph).
    c.model.scale_by_sigma = family != "duo"
    c.model.normalize = True
    c.model.time_conditioning = time_conditioning  # False: sigma_map folded into the adaLN biases
    c.graph.type = "uniform" if family == "duo" else "absorbing"
    c.noise.type = "loglinear"
    c.training.loss_chunk = 0 if family == "bd3lm" else c.training.loss_chunk
    c = ml_collections.ConfigDict(c.to_dict())
    c.vocab_size = GPT2_TOKENS + (family == "duo")  # DUO's [PAD] (id 50,257) is a token of its graph
    return c
