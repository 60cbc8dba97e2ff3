//! Appending new keys and values to a KV cache in place, before attention
//! over it: token `t` of batch `b` goes to cache position
//! `cache_seqlens[b] + t`, through the block table when the cache is paged.

use crate::arch;
use crate::common::problem::page_slot;
use crate::params::AppendParams;

// Each thread of a block (one row of one head) copies 16-byte chunks of k and v.
use flash_attn_abi::kernels::APPEND_THREADS;

/// The append kernel body.
///
/// # Safety
/// `params` describes tensors the host validated: every destination lies
/// inside the cache (and its page exists), rows are 16-byte aligned.
#[inline(always)]
pub unsafe fn append_kv(params: &AppendParams) {
    let token = arch::block_idx_x();
    let head = arch::block_idx_y() as i64;
    let batch = arch::block_idx_z();
    let position = arch::ld_global_i32(params.cache_seqlens.add(batch as usize)) as u32 + token;
    let (slot, row) = if params.block_table.is_null() {
        (batch as i64, position as i64)
    } else {
        let table = params.block_table.offset((batch as i64 * params.block_table_batch_stride) as isize);
        page_slot(table, position, params.page_size)
    };
    let at = |strides: [i64; 3], b: i64, r: i64| (b * strides[0] + r * strides[1] + head * strides[2]) as isize;
    let k_from = params.k_new.offset(at(params.k_new_strides, batch as i64, token as i64));
    let v_from = params.v_new.offset(at(params.v_new_strides, batch as i64, token as i64));
    let k_to = params.k_cache.offset(at(params.k_cache_strides, slot, row));
    let v_to = params.v_cache.offset(at(params.v_cache_strides, slot, row));
    let chunks = params.head_dim / 8;
    let mut chunk = arch::thread_idx_x();
    while chunk < 2 * chunks {
        let (from, to) = if chunk < chunks { (k_from, k_to) } else { (v_from, v_to) };
        let offset = (chunk % chunks * 8) as usize;
        arch::st_global_v4(to.add(offset) as *mut u8, arch::ld_global_v4(from.add(offset) as *const u8));
        chunk += APPEND_THREADS;
    }
}
