//! Per-sequence state: the KV cache of the attention layers, the
//! convolution and recurrent state of the DeltaNet layers, and how many
//! positions are filled.

use super::config::{Config, LayerKind};
use super::kvcache::{try_alloc, KvCache, KvType};
use crate::fault::Fault;

/// Per-sequence state: the KV cache of attention layers, the convolution
/// and recurrent state of DeltaNet layers, and the number of positions filled.
pub struct State {
    pub pos: usize,
    pub ctx: usize,
    /// Per layer: index of its slot in the KV cache or in the recurrent state.
    pub(super) slot: Vec<usize>,
    pub(super) kv: KvCache,          // [attention layers][ctx][Hkv·hd], keys and values
    pub(super) conv_state: Vec<f32>, // [DeltaNet layers][K−1][C]: the last K−1 projected inputs, oldest first
    pub(super) ssm_state: Vec<f32>,  // [DeltaNet layers][nv][dk][dv]
}

impl State {
    /// A state with an f32 KV cache.
    pub fn new(config: &Config, ctx: usize) -> Result<State, Fault> {
        Self::with_kv(config, ctx, KvType::F32)
    }

    pub fn with_kv(config: &Config, ctx: usize, kv_type: KvType) -> Result<State, Fault> {
        let mut slot = Vec::with_capacity(config.n_layers);
        let (mut n_attn, mut n_dn) = (0usize, 0usize);
        for kind in &config.layer_kinds {
            let counter = if *kind == LayerKind::DeltaNet { &mut n_dn } else { &mut n_attn };
            slot.push(*counter);
            *counter += 1;
        }
        let dn = config.deltanet;
        let conv = n_dn * dn.conv_kernel.saturating_sub(1) * dn.conv_dim();
        let ssm = n_dn * dn.n_v_heads * dn.k_head_dim * dn.v_head_dim;
        Ok(State {
            pos: 0,
            ctx,
            slot,
            kv: KvCache::new(kv_type, n_attn, ctx, config.kv_dim(), config.head_dim)?,
            conv_state: try_alloc(conv, 0.0f32, "convolution state")?,
            ssm_state: try_alloc(ssm, 0.0f32, "recurrent state")?,
        })
    }

    /// Bytes held by the caches and recurrent state.
    pub fn bytes(&self) -> usize {
        self.kv.bytes() + (self.conv_state.len() + self.ssm_state.len()) * 4
    }

    /// True when the model has recurrent (DeltaNet) state, which cannot be
    /// rewound to an earlier position, only reset.
    pub fn is_recurrent(&self) -> bool {
        !self.ssm_state.is_empty()
    }

    /// Forgets everything: back to position 0.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.conv_state.fill(0.0);
        self.ssm_state.fill(0.0);
    }

    /// Keeps the first `pos` positions. Attention caches simply stop there;
    /// recurrent state cannot rewind, so such a model starts over.
    pub fn truncate(&mut self, pos: usize) {
        if pos < self.pos {
            if self.is_recurrent() {
                self.reset();
            } else {
                self.pos = pos;
            }
        }
    }
}
