"""What tools/convert.py knows about each model family, in one table.

One entry per `.mlb` arch (docs/FORMAT.md): the names the family has in each
source format, its fixed traits (the metadata every model of the family gets,
whatever the source) and its default layer pattern.  The source readers
(source_hf.py, source_gguf.py, source_llama2c.py) look families up here and
read only what varies per model from their source; where a source states the
layer pattern itself (HF `layer_types` / `sliding_window_pattern`, GGUF
`attention.sliding_window_pattern`), that value overrides the family default
(`Family.layer_kinds`).
"""
import math
from dataclasses import dataclass

# .mlb layer kinds (metadata `layer_kinds`)
FULL, SLIDING, LINEAR = 0, 1, 2


@dataclass(frozen=True)
class Family:
    arch: str
    hf_model_types: tuple = ()      # config.json `model_type`
    hf_classes: tuple = ()          # config.json `architectures`
    gguf_arch: str = None           # GGUF `general.architecture` (None: not read from GGUF)
    qk_norm: bool = False           # RMSNorm of q and k per head
    gemma: bool = False             # Gemma block: (1 + w) norms, sandwich norms, embeddings
                                    # scaled by sqrt(hidden_size), GeGLU (tanh) feed-forward
    norm_unit_offset: bool = False  # (1 + w) norms without the rest of the Gemma block
    attn_output_gate: bool = False  # sigmoid gate on the attention output (q_proj rows doubled)
    linear_attention: bool = False  # Gated DeltaNet layers (layer kind LINEAR, `linear_attn.*`)
    nope_layers: bool = False       # some layers without RoPE (metadata `layer_rope`)
    # Default layer pattern when the source lists no kind per layer:
    #   "full"     every layer full attention;
    #   "periodic" the last layer of every `period` is full, the others slide
    #              (llama.cpp's swa pattern; a source may give its own period);
    #   "window"   every layer slides once the source gives a sliding window;
    #   "window_from" layers from the source's `max_window_layers` on slide once
    #              the source enables a sliding window.
    layers: str = "full"
    period: int = 0
    # llama.cpp conventions in its GGUF files
    gguf_qk_permuted: bool = False  # convert_hf_to_gguf permutes q/k rows to interleaved RoPE (LlamaModel only)
    gguf_softcaps: bool = False     # llama.cpp reads (and applies) the attention / final logit soft-caps
    gguf_local_rope_theta: float = None  # RoPE theta of sliding layers, which llama.cpp hard-codes

    @property
    def ffn_act(self):
        return "gelu_tanh" if self.gemma else "silu"

    def traits(self, hidden_size):
        """The fixed metadata of the family, in .mlb metadata order."""
        m = {}
        if self.qk_norm:
            m["qk_norm"] = 1
        if self.gemma:
            m["norm_unit_offset"] = 1
            m["norm_sandwich"] = 1
            m["embed_scale"] = math.sqrt(hidden_size)
            m["ffn_act"] = self.ffn_act
        if self.norm_unit_offset:
            m["norm_unit_offset"] = 1
        if self.attn_output_gate:
            m["attn_output_gate"] = 1
        return m

    def layer_kinds(self, n_layers, window=None, period=None, window_from=None):
        """Per-layer kinds (FULL / SLIDING) from the family's default pattern, or
        None when the pattern does not apply (every layer is full attention).

        window: the sliding window the source gives (and enables), if any;
        period: the source's own period for a "periodic" family (llama.cpp's
        semantics: 0 = every layer slides); window_from: the source's first
        sliding layer for a "window_from" family (default: none slides)."""
        if self.layers == "periodic":
            p = self.period if period is None else int(period)
            return [SLIDING if p == 0 or i % p < p - 1 else FULL for i in range(n_layers)]
        if self.layers == "window" and window:
            return [SLIDING] * n_layers
        if self.layers == "window_from" and window:
            first = int(window_from or n_layers)
            return [SLIDING if i >= first else FULL for i in range(n_layers)]
        return None


FAMILIES = {f.arch: f for f in [
    Family("llama", ("llama",), ("LlamaForCausalLM",), "llama", gguf_qk_permuted=True),
    Family("mistral", ("mistral",), ("MistralForCausalLM",), "mistral", layers="window", gguf_qk_permuted=True),
    Family("qwen2", ("qwen2",), ("Qwen2ForCausalLM",), "qwen2", layers="window_from"),
    Family("qwen3", ("qwen3",), ("Qwen3ForCausalLM",), "qwen3", qk_norm=True),
    Family("smollm3", ("smollm3",), ("SmolLM3ForCausalLM",), "smollm3", nope_layers=True),
    Family("gemma2", ("gemma2",), ("Gemma2ForCausalLM",), "gemma2", gemma=True, layers="periodic", period=2,
           gguf_softcaps=True),
    Family("gemma3", ("gemma3", "gemma3_text"), ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), "gemma3",
           qk_norm=True, gemma=True, layers="periodic", period=6, gguf_local_rope_theta=10000.0),
    Family("qwen3_5", ("qwen3_5", "qwen3_5_text"), ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
           qk_norm=True, norm_unit_offset=True, attn_output_gate=True, linear_attention=True),
    Family("llama2c"),  # karpathy/llama2.c checkpoints: plain Llama 2 blocks
]}

_HF_TYPES = {t: f for f in FAMILIES.values() for t in f.hf_model_types}
_HF_CLASSES = {c: f for f in FAMILIES.values() for c in f.hf_classes}
_GGUF = {f.gguf_arch: f for f in FAMILIES.values() if f.gguf_arch}


def from_hf(model_type, classes):
    """The family of a config.json: by `model_type`, else by the first known
    class in `architectures`; None if unknown."""
    fam = _HF_TYPES.get(model_type)
    for c in classes or []:
        fam = fam or _HF_CLASSES.get(c)
    return fam


def from_gguf(arch):
    """The family of a GGUF `general.architecture`; None if unknown."""
    return _GGUF.get(arch)
