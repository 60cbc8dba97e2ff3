//! The property test of the validation. Random calls, most of them at the
//! edges of what is valid (extreme sizes and strides, misaligned or
//! overlapping buffers, bad offsets, cache lengths and block tables, scales
//! and softcaps that overflow), go through every validation entry point:
//! dense, variable-length and KV cache calls (appending or not, dense or
//! paged), then the launch plan, as the runtime calls them; the dense and
//! variable-length ones also through the backward's validation and plan,
//! their gradients placed as q, k and v are. Run in a debug
//! build, so that an overflow anywhere panics. Whatever is refused must be
//! refused with an [`Error`], never a panic; whatever is accepted must be in
//! bounds for every index every kernel of the plan computes, as the bounds
//! model below restates it from the kernels' source.
//!
//! `PROPTEST_CASES` (default [`DEFAULT_CASES`]) and `PROPTEST_RNG_SEED`
//! (default fixed) change the run.

use std::collections::HashMap;
use std::mem::offset_of;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

use crate::call::Append;
use crate::limits::{MAX_ROW_STRIDE, MAX_SEQLEN};
use crate::plan::{
    plan, plan_backward_for, plan_for, BackwardPlan, Kernel, KernelArgs, KernelFamily, Launch, OutputAddrs, Plan,
    Sm80Plan, Sm90Backward, Sm90Plan,
};
use crate::validate::tests_support::device_slice;
use crate::validate::{validate, AttentionParams, Layout, Placed};
use crate::validate::{validate_backward, BackwardTensors};
use crate::validate::{validate_kvcache, validate_varlen, CacheArgs, OffsetsArg, OutputBuffers, TableArg};
use crate::{
    check_block_table_shape, check_cache_seqlens, check_seq_offsets, num_splits_heuristic, offsets_from_lengths, Error,
    MAX_SPLITS,
};
use flash_attn_abi::backward::{BackwardParams, BACKWARD_BLOCK_M, BACKWARD_BLOCK_N, ROW_KERNEL_ROWS};
use flash_attn_abi::hopper::HopperScratch;
use flash_attn_abi::hopper_backward::HopperBackwardScratch;
use flash_attn_abi::kernels::{Dtype, Variant};
use flash_attn_abi::params::ForwardParams;
use flash_attn_abi::params::{COMBINE_COLUMNS, COMBINE_WARPS};
use flash_attn_abi::sm90::TensorMapParams;

/// Cases per property when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 60_000;

fn config() -> Config {
    let mut config = Config { cases: DEFAULT_CASES, failure_persistence: None, ..Config::default() };
    // Config::default() reads PROPTEST_CASES and PROPTEST_RNG_SEED.
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config.cases = Config::default().cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x5eed_f1a5);
    }
    config
}

// ---------------------------------------------------------------------------
// The bounds model.

/// Largest grid x, and y or z, of a launch.
const GRID_X: i128 = i32::MAX as i128;
const GRID_YZ: i128 = 65_535;
const U32: std::ops::RangeInclusive<i128> = 0..=u32::MAX as i128;
const I32: std::ops::RangeInclusive<i128> = i32::MIN as i128..=i32::MAX as i128;

/// A buffer of a call: its address, its length in elements of `elem`
/// bytes, whether a kernel writes it, and the values of the i32 arrays the
/// kernels read (offsets, lengths, block table). The launch's own scratch
/// (`scratch`) shares memory with no other buffer.
#[derive(Clone, Debug)]
struct Buffer {
    name: &'static str,
    addr: u64,
    len: usize,
    elem: u64,
    written: bool,
    scratch: bool,
    values: Vec<i32>,
}

/// What the kernels of one call touch: the lowest and highest element index
/// of each buffer, and every way they go wrong.
#[derive(Default)]
struct Model {
    buffers: Vec<Buffer>,
    touched: HashMap<&'static str, (i128, i128)>,
    failures: Vec<String>,
}

impl Model {
    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(failure());
        }
    }

    /// A quantity a kernel holds in 32 bits, or a launch limit.
    fn fits(&mut self, what: &str, value: i128, range: std::ops::RangeInclusive<i128>) {
        self.check(range.contains(&value), || format!("{what} = {value} is outside {range:?}"));
    }

    fn buffer(&self, name: &str) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.name == name)
    }

    /// The buffer a kernel argument points to: the call's buffer `name`,
    /// at exactly that address.
    fn pointer(&mut self, what: &str, ptr: u64, name: &'static str) {
        let addr = self.buffer(name).map(|b| b.addr);
        self.check(addr == Some(ptr), || format!("{what} points to {ptr:#x}, not to {name} ({addr:x?})"));
    }

    /// Elements `base + sum(i * stride)` of `name`, each `i` of a term
    /// `(max, stride)` over `0..=max` (strides as the kernels hold them, i64).
    fn touch(&mut self, name: &'static str, base: i128, terms: &[(i128, i64)]) {
        let mut high = base;
        for &(max, stride) in terms {
            self.check(max >= 0, || format!("{name}: an index range 0..={max}"));
            if max > 0 {
                self.check(stride >= 0, || format!("{name}: stride {stride} multiplies indices up to {max}"));
                high += max * stride as i128;
            }
        }
        let range = self.touched.entry(name).or_insert((base, high));
        *range = (range.0.min(base), range.1.max(high));
    }

    /// Rows of `d` 16-bit elements of `name` from `base + sum(i * stride)`,
    /// which the kernels copy in 16-byte pieces: each row starts 16-byte
    /// aligned.
    fn rows(&mut self, name: &'static str, base: i128, terms: &[(i128, i64)], d: i128) {
        let addr = self.buffer(name).map_or(0, |b| b.addr);
        let aligned = addr % 16 == 0 && base % 8 == 0 && terms.iter().all(|&(max, stride)| max == 0 || stride % 8 == 0);
        self.check(aligned, || format!("{name}: rows at {addr:#x} + {base} + {terms:?} are not 16-byte aligned"));
        let mut terms = terms.to_vec();
        terms.push((d - 1, 1));
        self.touch(name, base, &terms);
    }

    /// Reads element `index` of the i32 array `name`, as a kernel does.
    fn read(&mut self, name: &'static str, index: i128) -> i128 {
        self.touch(name, index, &[]);
        let value = self.buffer(name).and_then(|b| usize::try_from(index).ok().and_then(|i| b.values.get(i)));
        match value {
            Some(&v) => v as i128,
            None => {
                self.failures.push(format!("{name}[{index}] read past its values"));
                0
            }
        }
    }

    /// The failures, with those of the touched ranges and of the buffers
    /// the kernels write.
    fn finish(mut self) -> Vec<String> {
        let mut touched: Vec<_> = self.touched.clone().into_iter().collect();
        touched.sort();
        for (name, (low, high)) in touched {
            let Some(b) = self.buffer(name).cloned() else {
                self.failures.push(format!("a kernel touches {name}, which the call does not pass"));
                continue;
            };
            self.check(low >= 0 && high < b.len as i128, || {
                format!("{name}: elements {low}..={high} touched, but it holds {}", b.len)
            });
            // Offsets are i64 element counts, pointer offsets isize bytes.
            self.fits(
                &format!("{name}: the byte offset of element {high}"),
                high * b.elem as i128,
                0..=isize::MAX as i128,
            );
        }
        let passed = || self.buffers.iter().filter(|b| !b.scratch && b.len > 0);
        for w in passed().filter(|b| b.written) {
            let end = |b: &Buffer| b.addr as u128 + b.len as u128 * b.elem as u128;
            for other in passed().filter(|o| o.name != w.name) {
                if (w.addr as u128) < end(other) && (other.addr as u128) < end(w) {
                    self.failures.push(format!("{} is written but overlaps {}", w.name, other.name));
                }
            }
        }
        self.failures
    }
}

/// One batch's sequences as a kernel sees them (`kernels/src/common/problem.rs`).
struct Sequence {
    seqlen_q: i128,
    seqlen_k: i128,
    q: i128,
    o: i128,
    lse: i128,
    k: i128,
    v: i128,
    /// The index of the batch's row in the block table.
    pages: Option<i128>,
}

/// The names of the call's tensors.
#[derive(Clone, Copy)]
struct Names {
    k: &'static str,
    v: &'static str,
}

/// `ceil(n / block) * block`.
fn round_up(n: i128, block: i128) -> i128 {
    (n + block - 1).div_euclid(block) * block
}

/// The attention kernel of a plan, launched with the arguments `a` (its
/// outputs and scratch bound), then the split-KV merge
/// (`kernels/src/forward/sm80/`, `kernels/src/combine.rs`).
fn attention(m: &mut Model, plan: &Sm80Plan, a: ForwardParams, names: Names, per_batch_data: bool) {
    let c = plan.kernel.config;
    let (block_m, block_n, d) = (c.block_m as i128, c.block_n as i128, plan.kernel.head_dim as i128);
    let general = plan.kernel.variant.is_general();
    let (batch, heads, splits) = (a.batch as i128, a.heads_q as i128, a.num_splits as i128);
    let (grid_x, grid_y, grid_z) = (plan.grid[0] as i128, plan.grid[1] as i128, plan.grid[2] as i128);
    m.check(c.head_dim as i128 == d, || format!("a d={} kernel for head_dim {d}", c.head_dim));
    // The launch, and the kernels' assumptions (assert_unchecked).
    m.fits("grid x", grid_x, 1..=GRID_X);
    m.fits("grid y", grid_y, 1..=GRID_YZ);
    m.fits("grid z", grid_z, 1..=GRID_YZ);
    m.check(grid_y == heads && grid_z == batch, || format!("grid {:?} for {heads} heads, batch {batch}", plan.grid));
    m.fits("seqlen_q", a.seqlen_q as i128, 1..=i32::MAX as i128);
    m.check(grid_x == round_up(a.seqlen_q as i128, block_m) / block_m * splits, || format!("grid x {grid_x}"));
    m.fits("heads_per_kv", a.heads_per_kv as i128, 1..=heads);
    m.fits("num_splits", splits, 1..=MAX_SPLITS as i128);
    let factors = [a.scale_log2, a.softcap_scale, a.softcap_log2];
    m.check(factors.iter().all(|x| x.is_finite()), || format!("the folded factors {factors:?}"));
    if !general {
        // The dense kernels read no feature.
        let featureless = a.cu_seqlens_q.is_null()
            && a.cu_seqlens_k.is_null()
            && a.seqused_k.is_null()
            && a.block_table.is_null()
            && a.alibi_slopes.is_null()
            && a.softcap_scale == 0.0
            && a.window_left == -1
            && (a.window_right == -1 || a.window_right == 0)
            && splits == 1
            && a.seqlen_k >= 1;
        m.check(featureless, || format!("the dense {:?} kernel for {a:?}", plan.kernel.variant));
    }
    m.pointer("q", a.q as u64, "q");
    m.pointer("o", a.o as u64, "o");
    m.pointer("lse", a.lse as u64, "lse");
    m.pointer("k", a.k as u64, names.k);
    m.pointer("v", a.v as u64, names.v);
    let metadata = [
        (a.cu_seqlens_q as u64, "cu_seqlens_q"),
        (a.cu_seqlens_k as u64, "cu_seqlens_k"),
        (a.alibi_slopes as u64, "alibi_slopes"),
        (a.block_table as u64, "block_table"),
    ];
    for (ptr, name) in metadata {
        if ptr != 0 {
            m.pointer(name, ptr, name);
        }
    }
    let seqused = match a.seqused_k as u64 {
        0 => None,
        ptr if !plan.upload.is_empty() => Some((ptr, "seqused_k (scratch)")),
        ptr => Some((ptr, "cache_seqlens")),
    };
    if let Some((ptr, name)) = seqused {
        m.pointer("seqused_k", ptr, name);
    }
    if !a.block_table.is_null() {
        let page_size = a.page_size as i128;
        m.check(page_size > 0 && page_size % block_n == 0, || {
            format!("pages of {page_size} rows, blocks of {block_n}")
        });
    }
    // Batches differ only by their strides without per-batch data. Where
    // there are few, every row of o and lse is listed, to find two on one
    // element (`DISTINCT_ROWS`).
    let list_rows = batch * a.seqlen_q as i128 * heads <= DISTINCT_ROWS;
    let (mut o_rows, mut lse_rows) = (vec![], vec![]);
    let batches: Vec<i128> = if per_batch_data || list_rows { (0..batch).collect() } else { vec![0, batch - 1] };
    for b in batches {
        if !m.failures.is_empty() {
            return;
        }
        let mut seq = Sequence {
            seqlen_q: a.seqlen_q as i128,
            seqlen_k: a.seqlen_k as i128,
            q: b * a.q_batch_stride as i128,
            o: b * a.o_batch_stride as i128,
            lse: b * a.lse_batch_stride as i128,
            k: b * a.k_batch_stride as i128,
            v: b * a.v_batch_stride as i128,
            pages: None,
        };
        if general {
            if !a.cu_seqlens_q.is_null() {
                let (start, end) = (m.read("cu_seqlens_q", b), m.read("cu_seqlens_q", b + 1));
                seq.seqlen_q = end - start;
                (seq.q, seq.o) = (start * a.q_row_stride as i128, start * a.o_row_stride as i128);
                seq.lse += start;
            }
            if !a.cu_seqlens_k.is_null() {
                let (start, end) = (m.read("cu_seqlens_k", b), m.read("cu_seqlens_k", b + 1));
                seq.seqlen_k = end - start;
                (seq.k, seq.v) = (start * a.k_row_stride as i128, start * a.v_row_stride as i128);
            }
            if let Some((_, name)) = seqused {
                seq.seqlen_k = m.read(name, b);
            }
            if !a.block_table.is_null() {
                seq.pages = Some(b * a.block_table_batch_stride as i128);
                (seq.k, seq.v) = (0, 0);
            }
        }
        let (sq, sk) = (seq.seqlen_q, seq.seqlen_k);
        m.fits("a sequence's queries", sq, 0..=a.seqlen_q as i128);
        m.fits("a sequence's keys", sk, 0..=i32::MAX as i128);
        if sq <= 0 {
            m.check(general, || "a dense kernel over no query".into());
            continue; // the general kernels return before any access
        }
        let (h, kv_h) = (heads - 1, (heads - 1) / (a.heads_per_kv as i128).max(1));
        m.rows("q", seq.q, &[(sq - 1, a.q_row_stride), (h, a.q_head_stride)], d);
        m.rows("o", seq.o, &[(sq - 1, a.o_row_stride), (h, a.o_head_stride)], d);
        m.touch("lse", seq.lse, &[(h, a.lse_head_stride), (sq - 1, 1)]);
        if list_rows {
            for (r, head) in (0..sq).flat_map(|r| (0..heads).map(move |head| (r, head))) {
                o_rows.push(seq.o + r * a.o_row_stride as i128 + head * a.o_head_stride as i128);
                lse_rows.push(seq.lse + head * a.lse_head_stride as i128 + r);
            }
        }
        if !a.alibi_slopes.is_null() {
            m.touch("alibi_slopes", b * a.alibi_batch_stride as i128, &[(h, 1)]);
        }
        if sk > 0 {
            match seq.pages {
                None => {
                    m.rows(names.k, seq.k, &[(sk - 1, a.k_row_stride), (kv_h, a.k_head_stride)], d);
                    m.rows(names.v, seq.v, &[(sk - 1, a.v_row_stride), (kv_h, a.v_head_stride)], d);
                }
                Some(row) => {
                    let page_size = (a.page_size as i128).max(1);
                    for p in 0..round_up(sk, page_size) / page_size {
                        if !m.failures.is_empty() {
                            return; // e.g. past the block table, at every page
                        }
                        let page = m.read("block_table", row + p);
                        let rows = page_size.min(sk - p * page_size);
                        for (name, [page_stride, row_stride, head_stride]) in [
                            (names.k, [a.k_batch_stride, a.k_row_stride, a.k_head_stride]),
                            (names.v, [a.v_batch_stride, a.v_row_stride, a.v_head_stride]),
                        ] {
                            m.rows(name, page * page_stride as i128, &[(rows - 1, row_stride), (kv_h, head_stride)], d);
                        }
                    }
                }
            }
        }
        // Tile rows: `row * row_stride + column` in u32, for the rows a tile
        // copies (pipeline.rs), within one page for a paged cache.
        for (what, rows, stride) in [
            ("q tile row offsets", sq.min(block_m), a.q_row_stride),
            ("o tile row offsets", sq.min(block_m), a.o_row_stride),
            ("k tile row offsets", sk.min(block_n), a.k_row_stride),
            ("v tile row offsets", sk.min(block_n), a.v_row_stride),
        ] {
            if rows > 1 {
                m.fits(what, (rows - 1) * stride as i128 + d - 1, U32);
            }
        }
        // Positions in i32 (problem.rs, softmax.rs): rows and keys up to
        // their blocks' ends, the diagonal, and their differences.
        positions(m, round_up(sq, block_m), round_up(sk.max(1), block_n), sk - sq);
        if splits > 1 {
            m.check(general, || "a split on a dense kernel".into());
            // [split, batch, head, row] over the longest seqlen_q; the part
            // before the row in u32 (forward.rs), the rest in usize.
            let rows_before = ((splits - 1) * grid_z + b) * heads + h;
            m.fits("partial row of the last split", rows_before * a.seqlen_q as i128, U32);
            let first = b * heads * a.seqlen_q as i128;
            let last = rows_before * a.seqlen_q as i128 + sq - 1;
            m.touch("lse_partial", first, &[(last - first, 1)]);
            m.touch("o_partial", first * d, &[(last - first, d as i64), (d - 1, 1)]);
        }
    }
    for (what, mut rows, width) in [("o", o_rows, d), ("lse", lse_rows, 1)] {
        rows.sort_unstable();
        let shared = rows.windows(2).find(|w| w[1] - w[0] < width);
        m.check(shared.is_none(), || format!("two rows of {what} share memory: at {shared:?}"));
    }
    if splits > 1 {
        // The merge (combine.rs) reads the partials the forward wrote and
        // writes o and lse where the forward would have: one warp per
        // (row, 8 columns), numbered in u32.
        let rows = batch * heads * a.seqlen_q as i128;
        let warps = plan.combine_blocks as i128 * COMBINE_WARPS as i128;
        m.fits("merged rows", rows, U32);
        m.fits("the merge's last partial row", splits * rows - 1, U32);
        m.fits("the merge's last warp", warps - 1, U32);
        m.fits("merge blocks", plan.combine_blocks as i128, 1..=GRID_X);
        m.check(warps >= rows * (d / COMBINE_COLUMNS as i128), || format!("{warps} merge warps for {rows} rows"));
        m.check(plan.scratch.o_partial % 16 == 0, || "o_partial not 16-byte aligned".into());
    }
}

/// The positions the kernels hold in i32 (problem.rs, softmax.rs) for rows
/// up to the end of their last block `rows_end`, keys up to `keys_end`,
/// and the sequence's `diagonal`: each, and their differences.
fn positions(m: &mut Model, rows_end: i128, keys_end: i128, diagonal: i128) {
    m.fits("last row of the last query block", rows_end - 1, I32);
    m.fits("end of the last key block", keys_end, I32);
    m.fits("diagonal", diagonal, I32);
    for (what, low, high) in [
        ("row + diagonal", diagonal, rows_end - 1 + diagonal),
        ("key - row", 1 - rows_end, keys_end - 1),
        ("key - row - diagonal", 1 - rows_end - diagonal, keys_end - 1 - diagonal),
        ("row + diagonal - key", diagonal + 1 - keys_end, rows_end - 1 + diagonal),
    ] {
        m.fits(what, low, I32);
        m.fits(what, high, I32);
    }
}

/// The append kernel (`kernels/src/append.rs`): `pages_per_seq` of the
/// block table if paged. Then, where the rows written times the rows read
/// are few enough to compare one by one, that no row it writes is read as
/// another key of the call ([`check_conflicts`]).
fn append(m: &mut Model, append: &Append, names: Names, pages_per_seq: Option<usize>, stats: &mut Stats) {
    let p = append.params;
    let (seqlen_new, heads_kv, batch) = (append.grid[0] as i128, append.grid[1] as i128, append.grid[2] as i128);
    m.fits("append grid x", seqlen_new, 1..=GRID_X);
    m.fits("append grid y", heads_kv, 1..=GRID_YZ);
    m.fits("append grid z", batch, 1..=GRID_YZ);
    let d = p.head_dim as i128;
    m.check(d > 0 && d % 8 == 0, || format!("append of head_dim {d}"));
    m.pointer("append k_new", p.k_new as u64, "k_new");
    m.pointer("append v_new", p.v_new as u64, "v_new");
    m.pointer("append k_cache", p.k_cache as u64, names.k);
    m.pointer("append v_cache", p.v_cache as u64, names.v);
    m.pointer("append cache_seqlens", p.cache_seqlens as u64, "cache_seqlens");
    let paged = !p.block_table.is_null();
    m.check(paged == pages_per_seq.is_some(), || "the append's block table".into());
    if paged {
        m.pointer("append block_table", p.block_table as u64, "block_table");
        m.check(p.page_size > 0, || "append into pages of 0 rows".into());
    }
    let page_size = (p.page_size as i128).max(1);
    let caches = [(names.k, p.k_cache_strides), (names.v, p.v_cache_strides)];
    for b in 0..batch {
        if !m.failures.is_empty() {
            return;
        }
        let cached = m.read("cache_seqlens", b);
        let (first, last) = (cached, cached + seqlen_new - 1);
        // `cache_seqlens[b] as u32 + token`.
        m.fits("last appended position", last, U32);
        for (name, [bs, rs, hs]) in [("k_new", p.k_new_strides), ("v_new", p.v_new_strides)] {
            m.rows(name, b * bs as i128, &[(seqlen_new - 1, rs), (heads_kv - 1, hs)], d);
        }
        // The rows written, page by page (a dense cache: the batch's slot).
        let columns = if paged { first.div_euclid(page_size)..=last.div_euclid(page_size) } else { 0..=0 };
        for column in columns {
            if !m.failures.is_empty() {
                return; // e.g. past the block table, at every page
            }
            let (slot, first_row, last_row) = if paged {
                let page = m.read("block_table", b * p.block_table_batch_stride as i128 + column);
                let base = column * page_size;
                (page, first.max(base) - base, last.min(base + page_size - 1) - base)
            } else {
                (b, first, last)
            };
            for (name, [ss, rs, hs]) in caches {
                let base = slot * ss as i128 + first_row * rs as i128;
                m.rows(name, base, &[(last_row - first_row, rs), (heads_kv - 1, hs)], d);
            }
        }
    }
    let rows_written = batch * seqlen_new * heads_kv;
    let runs_read = batch * pages_per_seq.unwrap_or(1) as i128 * heads_kv;
    if m.failures.is_empty() && rows_written * runs_read <= CONFLICT_WORK {
        for cache in caches {
            check_conflicts(m, &p, cache, (seqlen_new, heads_kv, batch), pages_per_seq);
        }
        stats.append_conflicts_checked += 1;
    }
}

/// Most rows of o that [`attention`] lists to compare.
const DISTINCT_ROWS: i128 = 1 << 12;

/// Most rows written times runs of rows read that [`append`] compares.
const CONFLICT_WORK: i128 = 1 << 14;

/// Fails where a row the append writes to the cache `name` overlaps, in
/// memory, a row that the attention then reads as another key than the one
/// written there: each batch reads its keys `0..cache_seqlens[b] +
/// seqlen_new` of every KV head (through its row of the block table, if
/// paged). Each written row is compared with each run of rows read.
fn check_conflicts(
    m: &mut Model,
    p: &flash_attn_abi::params::AppendParams,
    (name, [ss, rs, hs]): (&'static str, [i64; 3]),
    (seqlen_new, heads_kv, batch): (i128, i128, i128),
    pages_per_seq: Option<usize>,
) {
    let (ss, rs, hs, d) = (ss as i128, rs as i128, hs as i128, p.head_dim as i128);
    let page_size = (p.page_size as i128).max(1);
    let lengths = m.buffer("cache_seqlens").map(|b| b.values.clone()).unwrap_or_default();
    let table = m.buffer("block_table").map(|b| b.values.clone()).unwrap_or_default();
    // Each batch's runs of rows read: (slot, rows, first position).
    let runs = |b: i128| -> Vec<(i128, i128, i128)> {
        let used = lengths[b as usize] as i128 + seqlen_new;
        match pages_per_seq {
            None => vec![(b, used, 0)],
            Some(per_seq) => (0..round_up(used, page_size) / page_size)
                .map(|col| {
                    let page = table[(b * per_seq as i128 + col) as usize] as i128;
                    (page, page_size.min(used - col * page_size), col * page_size)
                })
                .collect(),
        }
    };
    // Where key `position` of batch `b`, head `h`, lies.
    let at = |b: i128, position: i128, h: i128| {
        let (slot, row) = match pages_per_seq {
            None => (b, position),
            Some(per_seq) => {
                (table[(b * per_seq as i128 + position / page_size) as usize] as i128, position % page_size)
            }
        };
        slot * ss + row * rs + h * hs
    };
    for wb in 0..batch {
        for position in lengths[wb as usize] as i128..lengths[wb as usize] as i128 + seqlen_new {
            for wh in 0..heads_kv {
                let w = at(wb, position, wh);
                for b in 0..batch {
                    for (slot, rows, first_position) in runs(b) {
                        for h in 0..heads_kv {
                            // Rows r < rows with |slot * ss + r * rs + h * hs - w| < d.
                            let base = slot * ss + h * hs;
                            let (low, high) = (w - d + 1 - base, w + d - 1 - base);
                            let (r0, r1) = match rs {
                                0 if low <= 0 && 0 <= high => (0, rows - 1),
                                0 => (1, 0),
                                _ => (low.div_euclid(rs) + (low.rem_euclid(rs) != 0) as i128, high.div_euclid(rs)),
                            };
                            let (r0, r1) = (r0.max(0), r1.min(rows - 1));
                            let own = b == wb && h == wh && (r0..=r1).contains(&(position - first_position));
                            if r1 - r0 + 1 > own as i128 {
                                m.failures.push(format!(
                                    "{name}: batch {wb} appends its key {position} (head {wh}) over keys {}..={} \
                                     (head {h}) that batch {b} reads",
                                    first_position + r0,
                                    first_position + r1
                                ));
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Generated calls.

/// The strides of a generated tensor.
#[derive(Clone, Copy, Debug)]
enum Strides {
    Contiguous,
    /// Stored `[batch, heads, seqlen, head_dim]`.
    HeadsMajor,
    /// Rows and batches padded by that many elements.
    Padded(usize, usize),
    /// Contiguous but for the dimensions marked, of stride 0.
    Broadcast([bool; 3]),
    /// Any strides over batch, seqlen, heads, and 1.
    Raw([usize; 3]),
}

/// The buffer behind a generated tensor, beside its view's span.
#[derive(Clone, Copy, Debug)]
enum Len {
    Exact,
    Short,
    Over(usize),
    Huge,
}

#[derive(Clone, Copy, Debug)]
struct TensorSpec {
    strides: Strides,
    len: Len,
    /// Bytes off the buffer's 16-byte alignment.
    misalign: u64,
}

impl TensorSpec {
    fn layout(&self, shape: [usize; 4]) -> Layout {
        let [_, s, h, d] = shape;
        let contiguous = Layout::contiguous(shape);
        let strides = match self.strides {
            Strides::Contiguous => contiguous.strides,
            Strides::HeadsMajor => [contiguous.strides[0], d, s.saturating_mul(d), 1],
            Strides::Padded(row, batch) => {
                let row_stride = h.saturating_mul(d).saturating_add(row);
                [s.saturating_mul(row_stride).saturating_add(batch), row_stride, d, 1]
            }
            Strides::Broadcast(zero) => {
                // Stored without the dimensions broadcast.
                let stored = std::array::from_fn(|i| if i < 3 && zero[i] { 1 } else { shape[i] });
                let mut strides = Layout::contiguous(stored).strides;
                (0..3).filter(|&i| zero[i]).for_each(|i| strides[i] = 0);
                strides
            }
            Strides::Raw([b, s, h]) => [b, s, h, 1],
        };
        Layout::strided(shape, strides)
    }

    fn buffer_len(&self, layout: &Layout) -> usize {
        match (layout.span(), self.len) {
            (Some(span), Len::Exact) => span,
            (Some(span), Len::Short) => span.saturating_sub(1),
            (Some(span), Len::Over(n)) => span.saturating_add(n),
            (_, Len::Huge) | (None, _) => 1 << 46,
        }
    }
}

/// Mostly `typical`; else one of `extremes`, a power of two give or take
/// one (where 32-bit quantities end), or anything.
fn typical_or_extreme(typical: std::ops::RangeInclusive<usize>, extremes: Vec<usize>) -> BoxedStrategy<usize> {
    let near_power_of_two = (16..34u32, -1..=1isize).prop_map(|(k, e)| (1usize << k).wrapping_add_signed(e));
    prop_oneof![40 => typical, 2 => select(extremes), 1 => near_power_of_two, 1 => any::<usize>()].boxed()
}

/// Sizes at the kernels' limits and past them.
fn size_extremes() -> Vec<usize> {
    let i32_max = i32::MAX as usize;
    vec![
        0,
        1,
        MAX_SEQLEN - 1,
        MAX_SEQLEN,
        MAX_SEQLEN + 1,
        i32_max,
        i32_max + 1,
        u32::MAX as usize,
        1 << 32,
        65_535,
        65_536,
        usize::MAX,
        usize::MAX / 2,
    ]
}

fn stride() -> BoxedStrategy<usize> {
    let extremes = vec![
        0,
        8,
        12,
        MAX_ROW_STRIDE - 8,
        MAX_ROW_STRIDE,
        MAX_ROW_STRIDE + 8,
        1 << 31,
        1 << 32,
        usize::MAX - 7,
        usize::MAX,
    ];
    prop_oneof![4 => (0..4096usize).prop_map(|n| 8 * n), 2 => select(extremes), 1 => any::<usize>()].boxed()
}

fn tensor_spec() -> BoxedStrategy<TensorSpec> {
    let strides = prop_oneof![
        30 => Just(Strides::Contiguous),
        3 => Just(Strides::HeadsMajor),
        4 => (select(vec![0, 8, 64, 4096]), select(vec![0, 8, 1024])).prop_map(|(r, b)| Strides::Padded(r, b)),
        2 => any::<[bool; 3]>().prop_map(Strides::Broadcast),
        1 => [stride(), stride(), stride()].prop_map(Strides::Raw),
    ];
    let len = prop_oneof![60 => Just(Len::Exact), 1 => Just(Len::Short), 4 => (1..100_000usize).prop_map(Len::Over), 1 => Just(Len::Huge)];
    let misalign = prop_oneof![100 => Just(0u64), 1 => select(vec![2u64, 4, 8])];
    (strides, len, misalign).prop_map(|(strides, len, misalign)| TensorSpec { strides, len, misalign }).boxed()
}

/// A softmax scale or softcap: typical, at f32's ends, or anything.
fn factor(typical: std::ops::Range<f32>) -> BoxedStrategy<Option<f32>> {
    let extremes = vec![
        0.0,
        -1.0,
        f32::NAN,
        f32::INFINITY,
        f32::MAX,
        f32::MAX / std::f32::consts::LOG2_E,
        2.3e38,
        2.4e38,
        1e38,
        1e-45,
        1e-38,
        f32::MIN_POSITIVE,
    ];
    prop_oneof![
        16 => Just(None),
        8 => typical.prop_map(Some),
        2 => select(extremes).prop_map(Some),
        1 => any::<f32>().prop_map(Some),
    ]
    .boxed()
}

fn window_side() -> BoxedStrategy<Option<usize>> {
    let extremes = vec![i32::MAX as usize, i32::MAX as usize + 1, usize::MAX, MAX_SEQLEN];
    prop_oneof![6 => Just(None), 3 => (0..300usize).prop_map(Some), 1 => select(extremes).prop_map(Some)].boxed()
}

/// ALiBi slopes: per head, per batch and head, or another count; in their
/// own buffer or over another argument's.
#[derive(Clone, Copy, Debug)]
struct AlibiSpec {
    count: u8,
    other: usize,
    over: Option<usize>,
}

/// The options of a generated call.
#[derive(Clone, Debug)]
struct Features {
    causal: bool,
    scale: Option<f32>,
    softcap: Option<f32>,
    window: (Option<usize>, Option<usize>),
    alibi: Option<AlibiSpec>,
    num_splits: Option<usize>,
    /// CTAs the GPU runs at once, for the split heuristic.
    wave: usize,
}

fn features() -> BoxedStrategy<Features> {
    let alibi = prop_oneof![
        6 => Just(None),
        2 => (0..3u8, 0..100usize, prop_oneof![8 => Just(None), 1 => (0..12usize).prop_map(Some)])
            .prop_map(|(count, other, over)| Some(AlibiSpec { count, other, over })),
    ];
    let num_splits = prop_oneof![
        6 => Just(None),
        1 => Just(Some(2)),
        3 => (1..=8usize).prop_map(Some),
        1 => select(vec![0, MAX_SPLITS, MAX_SPLITS + 1, usize::MAX]).prop_map(Some),
    ];
    let wave = prop_oneof![4 => Just(132 * 6), 2 => Just(132 * 2), 2 => 1..4000usize, 1 => select(vec![0, usize::MAX])];
    (any::<bool>(), factor(0.01..4.0), factor(1.0..100.0), (window_side(), window_side()), alibi, num_splits, wave)
        .prop_map(|(causal, scale, softcap, window, alibi, num_splits, wave)| Features {
            causal,
            scale,
            softcap,
            window,
            alibi,
            num_splits,
            wave,
        })
        .boxed()
}

/// The sizes shared by every kind of call.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads_kv: usize,
    groups: usize,
    head_dim: usize,
}

fn dims(max_batch: usize) -> BoxedStrategy<Dims> {
    let head_dim = prop_oneof![
        12 => select(crate::SUPPORTED_HEAD_DIMS.map(|d| d as usize).to_vec()),
        1 => select(vec![0, 8, 16, 48, 264, 288, 512]),
        1 => any::<usize>(),
    ];
    (
        typical_or_extreme(1..=max_batch, vec![65_535, 65_536, usize::MAX]),
        prop_oneof![1 => Just(1), 3 => typical_or_extreme(1..=300, size_extremes())],
        typical_or_extreme(1..=600, size_extremes()),
        typical_or_extreme(1..=4, vec![65_535, 65_536, 1 << 20]),
        typical_or_extreme(1..=4, vec![8, 16_384, 65_535, usize::MAX]),
        head_dim,
    )
        .prop_map(|(batch, seqlen_q, seqlen_k, heads_kv, groups, head_dim)| Dims {
            batch,
            seqlen_q,
            seqlen_k,
            heads_kv,
            groups,
            head_dim,
        })
        .boxed()
}

/// A mutation of a tensor's shape: (tensor, dimension, new size).
fn reshape() -> BoxedStrategy<Option<(usize, usize, usize)>> {
    prop_oneof![
        30 => Just(None),
        1 => (0..6usize, 0..4usize, typical_or_extreme(0..=300, size_extremes())).prop_map(Some),
    ]
    .boxed()
}

/// Moves buffer `.0` over buffer `.1`, `.2` bytes in.
fn alias() -> BoxedStrategy<Option<(usize, usize, u64)>> {
    prop_oneof![30 => Just(None), 1 => (0..12usize, 0..12usize, select(vec![0u64, 16, 4096])).prop_map(Some)].boxed()
}

/// A paged cache: pages, pages per sequence, and changes to the block
/// table (entry, page) after one that gives each batch its own pages.
type Paged = (usize, usize, Vec<(usize, i32)>);

/// What kind of call, with what is particular to it.
#[derive(Clone, Debug)]
enum Kind {
    Dense,
    Varlen {
        lengths_q: Vec<usize>,
        lengths_k: Vec<usize>,
        /// Offsets given outright instead of from the lengths: (of k?, offsets).
        offsets: Option<(bool, Vec<i32>)>,
    },
    Cache {
        /// Dense: slots per batch. Paged: rows per page.
        slots: usize,
        /// Paged: (pages, pages per sequence, table mutations).
        paged: Option<Paged>,
        /// Each batch's cached length as a fraction of what fits, /255.
        fill: Vec<u8>,
        seqlens: Option<(usize, i32)>,
        /// Appending: seqlen_new, k_new, v_new.
        new: Option<(usize, TensorSpec, TensorSpec)>,
    },
}

fn offsets() -> BoxedStrategy<Vec<i32>> {
    let value = prop_oneof![6 => 0..60i32, 1 => select(vec![-1, i32::MIN, i32::MAX, i32::MAX - 1]), 1 => any::<i32>()];
    proptest::collection::vec(value, 0..7).boxed()
}

fn kind() -> BoxedStrategy<Kind> {
    let length = || typical_or_extreme(0..=40, vec![MAX_SEQLEN, MAX_SEQLEN + 1, i32::MAX as usize, 1 << 31]);
    let varlen = (
        proptest::collection::vec(length(), 1..=5),
        proptest::collection::vec(length(), 1..=5),
        any::<bool>(),
        prop_oneof![8 => Just(None), 1 => (any::<bool>(), offsets()).prop_map(Some)],
    )
        .prop_map(|(lengths_q, mut lengths_k, same, offsets)| {
            if same || lengths_k.len() != lengths_q.len() {
                lengths_k.resize(lengths_q.len(), 3);
            }
            Kind::Varlen { lengths_q, lengths_k, offsets }
        });
    let table_edit = (0..24usize, prop_oneof![1 => Just(-1), 1 => 0..12i32, 1 => select(vec![i32::MAX, i32::MIN, 12])]);
    let paged = (
        typical_or_extreme(1..=12, vec![65_535, i32::MAX as usize, i32::MAX as usize + 1]),
        typical_or_extreme(1..=6, vec![1 << 20]),
        proptest::collection::vec(table_edit, 0..3),
    );
    // New keys and values alike, or not; often one row broadcast (seqlen stride 0).
    let broadcast = TensorSpec { strides: Strides::Broadcast([false, true, false]), len: Len::Exact, misalign: 0 };
    let new_spec = || prop_oneof![3 => tensor_spec(), 1 => Just(broadcast)];
    let new = (
        typical_or_extreme(1..=4, size_extremes()),
        new_spec(),
        prop_oneof![1 => Just(None), 1 => new_spec().prop_map(Some)],
    )
        .prop_map(|(seqlen_new, k_new, v_new)| (seqlen_new, k_new, v_new.unwrap_or(k_new)));
    let page_size = prop_oneof![
        12 => select(vec![64usize, 128, 256]),
        1 => select(vec![0usize, 32, 96, MAX_SEQLEN, 1 << 31, (1 << 32) + 64]),
    ];
    let cache = (
        typical_or_extreme(1..=600, size_extremes()),
        prop_oneof![1 => Just(None), 1 => (page_size, paged).prop_map(Some)],
        proptest::collection::vec(any::<u8>(), 8),
        prop_oneof![8 => Just(None), 1 => (0..4usize, prop_oneof![select(vec![-1, i32::MAX, i32::MIN]), any::<i32>()]).prop_map(Some)],
        prop_oneof![1 => Just(None), 2 => new.prop_map(Some)],
    )
        .prop_map(|(capacity, paged, fill, seqlens, new)| match paged {
            None => Kind::Cache { slots: capacity, paged: None, fill, seqlens, new },
            Some((page_size, paged)) => Kind::Cache { slots: page_size, paged: Some(paged), fill, seqlens, new },
        });
    prop_oneof![2 => Just(Kind::Dense), 2 => varlen, 3 => cache].boxed()
}

/// A generated call.
#[derive(Clone, Debug)]
struct Spec {
    kind: Kind,
    dims: Dims,
    /// q, k, v, o.
    tensors: [TensorSpec; 4],
    reshape: Option<(usize, usize, usize)>,
    /// The lse buffer beside what the call needs, and its misalignment.
    lse: (Len, u64),
    features: Features,
    alias: Option<(usize, usize, u64)>,
    gaps: [u64; 12],
}

fn spec() -> BoxedStrategy<Spec> {
    let lse = (
        prop_oneof![16 => Just(Len::Exact), 1 => Just(Len::Short), 1 => (1..100usize).prop_map(Len::Over)],
        prop_oneof![30 => Just(0u64), 1 => select(vec![2u64, 4])],
    );
    let gaps = proptest::array::uniform12(prop_oneof![4 => Just(0u64), 1 => Just(256), 1 => Just(1 << 20)]);
    (
        kind(),
        dims(4),
        [tensor_spec(), tensor_spec(), tensor_spec(), tensor_spec()],
        reshape(),
        lse,
        features(),
        alias(),
        gaps,
    )
        .prop_map(|(kind, dims, tensors, reshape, lse, features, alias, gaps)| Spec {
            kind,
            dims,
            tensors,
            reshape,
            lse,
            features,
            alias,
            gaps,
        })
        .boxed()
}

/// What the property test counts, to show that it exercised what it
/// checks: calls accepted by kind and feature, calls refused.
#[derive(Debug, Default)]
struct Stats {
    cases: usize,
    refused: usize,
    dense: usize,
    varlen: usize,
    cache_dense: usize,
    cache_paged: usize,
    appends: usize,
    append_conflicts_checked: usize,
    split: usize,
    gqa_decode: usize,
    general: usize,
    /// Dense and packed calls the sm_90a planner takes (checked by
    /// [`hopper`] too), and of them the packed ones.
    sm90a: usize,
    sm90a_packed: usize,
    /// Calls whose backward was planned and checked ([`backward`]), and of
    /// them, those in the deterministic mode.
    backward: usize,
    backward_sm90a: usize,
    deterministic: usize,
    errors: HashMap<String, usize>,
}

/// Buffer names, in the order of `Spec::gaps` and `Spec::alias`.
const BUFFERS: [&str; 12] = [
    "q",
    "k",
    "v",
    "o",
    "lse",
    "alibi_slopes",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "cache_seqlens",
    "block_table",
    "k_new",
    "v_new",
];

/// Runs a generated call through validation and the plan, as the runtime
/// calls them.
fn call(spec: &Spec) -> Result<Accepted, Error> {
    let Dims { batch, seqlen_q, seqlen_k, heads_kv, groups, head_dim: d } = spec.dims;
    let heads_q = heads_kv.saturating_mul(groups);
    let f = &spec.features;
    // Shapes, and the i32 arrays of the call.
    let mut shapes = [
        [batch, seqlen_q, heads_q, d],
        [batch, seqlen_k, heads_kv, d],
        [batch, seqlen_k, heads_kv, d],
        [batch, seqlen_q, heads_q, d],
    ];
    let mut values: HashMap<&'static str, Vec<i32>> = HashMap::new();
    let mut new_shape = None;
    let mut pages_per_seq = None;
    match &spec.kind {
        Kind::Dense => {}
        Kind::Varlen { lengths_q, lengths_k, offsets } => {
            let (Ok(mut cu_q), Ok(mut cu_k)) = (offsets_from_lengths(lengths_q), offsets_from_lengths(lengths_k))
            else {
                return offsets_from_lengths(lengths_q).and(offsets_from_lengths(lengths_k)).map(|_| unreachable!());
            };
            match offsets {
                Some((false, o)) => cu_q = o.clone(),
                Some((true, o)) => cu_k = o.clone(),
                None => {}
            }
            let total = |cu: &[i32]| cu.last().map_or(0, |&t| t.max(0) as usize);
            shapes[0] = [1, total(&cu_q), heads_q, d];
            shapes[3] = shapes[0];
            shapes[1] = [1, total(&cu_k), heads_kv, d];
            shapes[2] = shapes[1];
            values.insert("cu_seqlens_q", cu_q);
            values.insert("cu_seqlens_k", cu_k);
        }
        Kind::Cache { slots, paged, fill, seqlens, new } => {
            let batch = batch.min(8);
            shapes[0][0] = batch;
            shapes[3] = shapes[0];
            let seqlen_new = new.as_ref().map_or(0, |n| n.0);
            let capacity = match paged {
                None => {
                    shapes[1] = [batch, *slots, heads_kv, d];
                    *slots
                }
                Some((pages, per_seq, edits)) => {
                    shapes[1] = [*pages, *slots, heads_kv, d];
                    let per_seq = (*per_seq).min(64);
                    pages_per_seq = Some(per_seq);
                    let mut table: Vec<i32> =
                        (0..batch * per_seq).map(|i| (i % (*pages).clamp(1, 1 << 20)) as i32).collect();
                    for &(i, page) in edits {
                        if let Some(entry) = table.get_mut(i) {
                            *entry = page;
                        }
                    }
                    values.insert("block_table", table);
                    per_seq.saturating_mul(*slots)
                }
            };
            shapes[2] = shapes[1];
            // Lengths that leave room for the new keys; where there is none, 0 to 2.
            let room = capacity.saturating_sub(seqlen_new).min(i32::MAX as usize);
            let length = |x: u8| if room > 0 { (room as u128 * x as u128 / 255) as i32 } else { x as i32 % 3 };
            let mut lengths: Vec<i32> = fill[..batch].iter().map(|&x| length(x)).collect();
            if let Some((b, n)) = seqlens {
                if let Some(len) = lengths.get_mut(*b) {
                    *len = *n;
                }
            }
            values.insert("cache_seqlens", lengths);
            if new.is_some() {
                new_shape = Some([batch, seqlen_new, heads_kv, d]);
            }
        }
    }
    if let Some((t, dim, n)) = spec.reshape {
        match (t, &mut new_shape) {
            (0..4, _) => shapes[t][dim] = n,
            (_, Some(shape)) => shape[dim] = n,
            _ => {}
        }
    }
    // Layouts and buffer lengths, then addresses.
    let mut tensors: Vec<(Layout, usize)> = (0..4)
        .map(|i| (spec.tensors[i].layout(shapes[i]), i))
        .map(|(l, i)| (l, spec.tensors[i].buffer_len(&l)))
        .collect();
    let new_specs = match &spec.kind {
        Kind::Cache { new: Some((_, k_new, v_new)), .. } => Some([*k_new, *v_new]),
        _ => None,
    };
    if let (Some(shape), Some(specs)) = (new_shape, new_specs) {
        for s in specs {
            let layout = s.layout(shape);
            tensors.push((layout, s.buffer_len(&layout)));
        }
    }
    let lse_needed = shapes[0][0].saturating_mul(shapes[0][1]).saturating_mul(shapes[0][2]);
    let lse_len = match spec.lse.0 {
        Len::Short => lse_needed.saturating_sub(1),
        Len::Over(n) => lse_needed.saturating_add(n),
        _ => lse_needed,
    };
    let batches_for_alibi = match &spec.kind {
        Kind::Varlen { .. } => values["cu_seqlens_q"].len().saturating_sub(1),
        _ => shapes[0][0],
    };
    let alibi_len = f.alibi.map(|a| match a.count {
        0 => heads_q,
        1 => batches_for_alibi.saturating_mul(heads_q),
        _ => a.other,
    });
    // (name, elements, element bytes, misalignment), in BUFFERS order.
    let mut layout: Vec<(&'static str, usize, u64, u64)> = Vec::new();
    for (i, name) in BUFFERS.iter().enumerate() {
        let entry = match i {
            0..4 => Some((tensors[i].1, 2, spec.tensors[i].misalign)),
            4 => Some((lse_len, 4, spec.lse.1)),
            5 => alibi_len.map(|n| (n, 4, 0)),
            10 | 11 => tensors.get(i - 6).map(|t| (t.1, 2, new_specs.unwrap()[i - 10].misalign)),
            _ => values.get(name).map(|v| (v.len(), 4, 0)),
        };
        if let Some((len, elem, misalign)) = entry {
            layout.push((name, len, elem, misalign));
        }
    }
    let mut addrs: HashMap<&'static str, u64> = HashMap::new();
    let mut next = 1u64 << 32;
    for &(name, len, elem, misalign) in &layout {
        let gap = spec.gaps[BUFFERS.iter().position(|n| *n == name).unwrap()];
        let addr = next.saturating_add(gap).saturating_add(misalign);
        addrs.insert(name, addr);
        next = addr.saturating_add((len as u64).saturating_mul(elem)).saturating_add(255) & !255;
    }
    if let Some((from, to, offset)) = spec.alias {
        if let (true, Some(&at)) = (addrs.contains_key(BUFFERS[from]), addrs.get(BUFFERS[to])) {
            addrs.insert(BUFFERS[from], at.saturating_add(offset));
        }
    }
    if let Some(over) = f.alibi.and_then(|a| a.over) {
        if let Some(&at) = addrs.get(BUFFERS[over % BUFFERS.len()]) {
            addrs.insert("alibi_slopes", at);
        }
    }
    let cache = matches!(spec.kind, Kind::Cache { .. });
    let names =
        if cache { ["q", "k_cache", "v_cache", "o", "k_new", "v_new"] } else { ["q", "k", "v", "o", "k_new", "v_new"] };
    let placed: Vec<Placed> = tensors
        .iter()
        .enumerate()
        .map(|(i, &(layout, buffer_len))| Placed {
            name: names[i],
            layout,
            addr: addrs[BUFFERS[if i < 4 { i } else { i + 6 }]],
            buffer_len,
        })
        .collect();
    let slopes = alibi_len.map(|len| device_slice::<f32>(addrs["alibi_slopes"], len));
    let params = AttentionParams {
        causal: f.causal,
        softmax_scale: f.scale,
        window: f.window,
        softcap: f.softcap,
        alibi_slopes: slopes,
        num_splits: f.num_splits,
        deterministic: false,
    };
    let (q, k, v, o) = (&placed[0], &placed[1], &placed[2], &placed[3]);
    let lse_addr = addrs["lse"];
    let appending = placed.len() == 6;
    // Validation and the plan, as the runtime calls them.
    let outputs = OutputBuffers::Given { o, lse_addr, lse_len };
    let validated = match &spec.kind {
        Kind::Dense => validate(Dtype::F16, q, k, v, outputs, &params),
        Kind::Varlen { .. } => validate_varlen(
            Dtype::F16,
            q,
            k,
            v,
            OffsetsArg { host: &values["cu_seqlens_q"], addr: addrs["cu_seqlens_q"] },
            OffsetsArg { host: &values["cu_seqlens_k"], addr: addrs["cu_seqlens_k"] },
            outputs,
            &params,
        ),
        Kind::Cache { .. } => {
            let cache = CacheArgs {
                k: *k,
                v: *v,
                new: appending.then(|| (placed[4], placed[5])),
                seqlens: &values["cache_seqlens"],
                seqlens_addr: addrs["cache_seqlens"],
                block_table: pages_per_seq.map(|pages_per_seq| TableArg {
                    entries: &values["block_table"],
                    pages_per_seq,
                    addr: addrs["block_table"],
                }),
            };
            validate_kvcache(Dtype::F16, q, &cache, outputs, &params)
        }
    };
    let call = validated?;
    let plan = match plan(&call, |_| f.wave)? {
        Plan::Sm80(plan) => plan,
        Plan::Sm90(plan) => panic!("the sm_80 family planned {}", plan.kernel.name),
    };
    // On compute capability 9.0 the same call may take an sm_90a kernel.
    let sm90a = match plan_for(&call, |_| f.wave, KernelFamily::Sm90a { sm_count: f.wave })? {
        Plan::Sm90(plan) => Some(plan),
        Plan::Sm80(_) => None,
    };
    let problem = call.problem;
    // Accepted: the call's buffers, named as the kernels' arguments.
    let names = if cache { Names { k: "k_cache", v: "v_cache" } } else { Names { k: "k", v: "v" } };
    let mut buffers = Vec::new();
    for &(name, len, elem, _) in &layout {
        let written = matches!(name, "o" | "lse") || (appending && matches!(name, "k" | "v"));
        let values = values.get(name).cloned().unwrap_or_default();
        let model_name = match name {
            "k" => names.k,
            "v" => names.v,
            other => other,
        };
        buffers.push(Buffer { name: model_name, addr: addrs[name], len, elem, written, scratch: false, values });
    }
    let kind = match &spec.kind {
        Kind::Dense => "dense",
        Kind::Varlen { .. } => "varlen",
        Kind::Cache { paged: None, .. } => "dense cache",
        Kind::Cache { paged: Some(_), .. } => "paged cache",
    };
    let outputs = OutputAddrs { o: o.addr, lse: lse_addr };
    let backward = match cache {
        true => None,
        false => backward_call(call, [q, k, v, o], (lse_addr, lse_len), &params, next, f.wave)?,
    };
    Ok(Accepted {
        plan,
        sm90a,
        backward,
        outputs,
        problem,
        buffers,
        names,
        pages_per_seq,
        page_size: shapes[1][1],
        kind,
    })
}

/// The backward of an accepted dense or packed `forward` call over `q`, `k`,
/// `v` and `o` with `params`: dO and dQ placed as q is, dK and dV as k and
/// v, from address `next` on (past every buffer of the call), validated and
/// planned for a GPU of `sm_count` SMs, in the deterministic mode for about
/// a third of the calls. A call the forward accepted the backward refuses
/// only for the size of its scratch or its deterministic launches.
fn backward_call(
    forward: crate::call::Call,
    [q, k, v, o]: [&Placed; 4],
    (lse_addr, lse_len): (u64, usize),
    params: &AttentionParams,
    mut next: u64,
    sm_count: usize,
) -> Result<Option<(BackwardPlan, Vec<Buffer>)>, Error> {
    let mut place = |name: &'static str, like: &Placed| {
        let addr = (next.saturating_add(255) & !255).saturating_add(like.addr % 256);
        next = addr.saturating_add(2 * like.buffer_len as u64);
        Placed { name, addr, ..*like }
    };
    let (d_o, d_q, d_k, d_v) = (place("d_o", q), place("d_q", q), place("d_k", k), place("d_v", v));
    let tensors = BackwardTensors { o, lse_addr, lse_len, d_o: &d_o, d_q: &d_q, d_k: &d_k, d_v: &d_v };
    let deterministic = (sm_count.wrapping_add(forward.problem.seqlen_k)) % 3 == 0;
    let params = AttentionParams { deterministic, ..*params };
    // Three calls in four planned for compute capability 9.0, where the
    // sm_90a main kernel takes those it can (dense, d = 32 to 256, no
    // window, softcap, ALiBi or deterministic mode: few of the specs).
    let family = if sm_count.wrapping_add(forward.problem.seqlen_q) % 4 != 0 {
        KernelFamily::Sm90a { sm_count }
    } else {
        KernelFamily::Sm80
    };
    let planned = validate_backward(forward, q, k, v, &tensors, &params)
        .and_then(|call| plan_backward_for(&call, sm_count, family));
    let plan = match planned {
        Ok(plan) => plan,
        Err(Error::TooLarge { what: "backward scratch bytes" | "deterministic backward launches", .. }) => {
            return Ok(None)
        }
        Err(e) => return Err(Error::ShapeMismatch(format!("the backward refused an accepted forward call: {e}"))),
    };
    let buffers = [d_o, d_q, d_k, d_v]
        .into_iter()
        .map(|t| Buffer {
            name: t.name,
            addr: t.addr,
            len: t.buffer_len,
            elem: 2,
            written: t.name != "d_o",
            scratch: false,
            values: vec![],
        })
        .collect();
    Ok(Some((plan, buffers)))
}

/// A call that validation and the plan accepted, as the runtime would
/// launch it.
struct Accepted {
    plan: Sm80Plan,
    /// The plan on compute capability 9.0, where it takes an sm_90a kernel.
    sm90a: Option<Sm90Plan>,
    /// The backward of the call (dense or packed), planned, and its
    /// buffers beside the call's: dO and the gradients.
    backward: Option<(BackwardPlan, Vec<Buffer>)>,
    /// Where the call's outputs are.
    outputs: OutputAddrs,
    problem: crate::Problem,
    buffers: Vec<Buffer>,
    names: Names,
    pages_per_seq: Option<usize>,
    page_size: usize,
    kind: &'static str,
}

/// Where the model's launches find their scratch memory: far from every buffer.
const SCRATCH: u64 = 1 << 62;

/// Runs the bounds model over an accepted call: its failures, and the
/// elements it touches of each buffer.
fn check(call: &Accepted, stats: &mut Stats) -> (Vec<String>, HashMap<&'static str, (i128, i128)>) {
    let mut m = Model { buffers: call.buffers.clone(), ..Model::default() };
    // The launch's scratch: uploaded lengths, then the split-KV partials.
    let s = call.plan.scratch;
    for (name, offset, end, values) in [
        ("seqused_k (scratch)", s.seqused_k, s.lse_partial, call.plan.upload.clone()),
        ("lse_partial", s.lse_partial, s.o_partial, vec![]),
        ("o_partial", s.o_partial, s.bytes, vec![]),
    ] {
        let len = end.saturating_sub(offset) / 4;
        m.buffers.push(Buffer {
            name,
            addr: SCRATCH + offset as u64,
            len,
            elem: 4,
            written: true,
            scratch: true,
            values,
        });
    }
    m.check(s.seqused_k + 4 * call.plan.upload.len() <= s.lse_partial, || "seqused_k past its scratch".into());
    // What the launch runs: the plan bound to the outputs and the scratch.
    let launches = call.plan.launches(call.outputs, SCRATCH);
    if let Some(launch) = &call.plan.append {
        append(&mut m, launch, call.names, call.pages_per_seq, stats);
    }
    let a = launches
        .iter()
        .find_map(|l| if let KernelArgs::Forward(a) = l.args { Some(a) } else { None })
        .expect("an attention launch");
    attention(&mut m, &call.plan, a, call.names, call.kind != "dense");
    // The sizes the kernels' u32 fields took, untruncated.
    let problem = call.problem;
    let rows = a.heads_q as usize * a.seqlen_q as usize;
    m.check(a.batch as usize == problem.batch && rows == problem.heads_q * problem.seqlen_q, || {
        format!("{problem:?} became batch {}, {} heads of {} rows", a.batch, a.heads_q, a.seqlen_q)
    });
    m.check(a.seqlen_k as usize == problem.seqlen_k, || format!("seqlen_k {} for {problem:?}", a.seqlen_k));
    if let Some(per_seq) = call.pages_per_seq {
        m.check(a.page_size as usize == call.page_size, || format!("page_size {} of {}", a.page_size, call.page_size));
        m.check(a.block_table_batch_stride == per_seq as i64, || "block table stride".into());
    }
    match call.kind {
        "dense" => stats.dense += 1,
        "varlen" => stats.varlen += 1,
        "dense cache" => stats.cache_dense += 1,
        _ => stats.cache_paged += 1,
    }
    stats.appends += call.plan.append.is_some() as usize;
    stats.split += (a.num_splits > 1) as usize;
    stats.gqa_decode += (a.heads_q as usize != problem.heads_q) as usize;
    stats.general += call.plan.kernel.variant.is_general() as usize;
    let touched = m.touched.clone();
    let mut failures = m.finish();
    if let Some(plan) = &call.sm90a {
        stats.sm90a += 1;
        stats.sm90a_packed += !call.plan.args.cu_seqlens_q.is_null() as usize;
        let mut m = Model { buffers: call.buffers.clone(), ..Model::default() };
        hopper(&mut m, plan, call.outputs);
        failures.extend(m.finish().into_iter().map(|f| format!("sm_90a: {f}")));
    }
    if let Some((plan, gradients)) = &call.backward {
        stats.backward += 1;
        let rows = plan.rows();
        stats.deterministic += (rows.args.dq_splits > 0) as usize;
        stats.backward_sm90a += matches!(plan, BackwardPlan::Sm90(_)) as usize;
        let mut m = Model { buffers: call.buffers.iter().chain(gradients).cloned().collect(), ..Model::default() };
        // Its outputs are the gradients: the forward's o and lse are read.
        for b in m.buffers.iter_mut().filter(|b| matches!(b.name, "o" | "lse")) {
            b.written = false;
        }
        for (name, offset, len) in [
            ("delta (scratch)", rows.delta, rows.d_q_accum - rows.delta),
            ("d_q_accum (scratch)", rows.d_q_accum, rows.end - rows.d_q_accum),
        ] {
            let (addr, len) = (SCRATCH + offset as u64, len / 4);
            m.buffers.push(Buffer { name, addr, len, elem: 4, written: true, scratch: true, values: vec![] });
        }
        backward(&mut m, plan, call.kind != "dense");
        failures.extend(m.finish().into_iter().map(|f| format!("backward: {f}")));
    }
    (failures, touched)
}

/// The backward kernels of a plan (`kernels/src/backward`), launched with
/// the scratch bound: prepare and finish over every query row (dO and o
/// rows, delta, each split's dQ accumulator, dQ rows), the main kernel
/// over every key block of every launch (the k, v, dK and dV rows of its
/// keys, the q and dO rows, LSE, delta and accumulator of its group's
/// query rows). Every batch where sequences are packed, else the first and
/// the last.
fn backward(m: &mut Model, plan: &BackwardPlan, per_batch_data: bool) {
    let launches = plan.launches(SCRATCH);
    let args = |i: usize| match launches.get(i).map(|l| l.args) {
        Some(KernelArgs::Backward(a)) => Some(a),
        Some(KernelArgs::HopperBackward(h)) => Some(h.backward),
        _ => None,
    };
    let n = launches.len();
    let kinds: Vec<Kernel> = launches.iter().map(|l| l.kernel).collect();
    let (main, head_dim, main_launches) = match plan {
        BackwardPlan::Sm80(p) => (Kernel::Backward(p.kernel), p.kernel.config.head_dim, p.key_launches as usize),
        BackwardPlan::Sm90(p) => (Kernel::HopperBackward(p.kernel), p.kernel.head_dim, 1),
    };
    let rows = plan.rows();
    let expected = (n == main_launches + 2)
        && kinds[0] == Kernel::BackwardPrepare(rows.dtype)
        && kinds[n - 1] == Kernel::BackwardFinish(rows.dtype)
        && kinds[1..n - 1].iter().all(|&k| k == main);
    m.check(expected, || format!("the backward's launches {kinds:?}"));
    let Some(a) = args(0) else { return m.check(false, || "the backward's arguments".into()) };
    let f = a.forward;
    let (batch, heads, d) = (f.batch as i128, f.heads_q as i128, head_dim as i128);
    let (block_m, block_n) = (BACKWARD_BLOCK_M as i128, BACKWARD_BLOCK_N as i128);
    m.check(a.head_dim as i128 == d, || format!("head_dim {} for d={d}", a.head_dim));
    for (name, ptr) in [
        ("q", f.q as u64),
        ("k", f.k as u64),
        ("v", f.v as u64),
        ("o", f.o as u64),
        ("lse", f.lse as u64),
        ("d_o", a.d_o as u64),
        ("d_q", a.d_q as u64),
        ("d_k", a.d_k as u64),
        ("d_v", a.d_v as u64),
        ("delta (scratch)", a.delta as u64),
        ("d_q_accum (scratch)", a.d_q_accum as u64),
    ] {
        m.pointer(name, ptr, name);
    }
    for (ptr, name) in [
        (f.cu_seqlens_q as u64, "cu_seqlens_q"),
        (f.cu_seqlens_k as u64, "cu_seqlens_k"),
        (f.alibi_slopes as u64, "alibi_slopes"),
    ] {
        if ptr != 0 {
            m.pointer(name, ptr, name);
        }
    }
    let untaken = f.seqused_k.is_null() && f.block_table.is_null() && f.num_splits == 1;
    m.check(untaken, || format!("a backward over a KV cache or split: {f:?}"));
    // The grids, the same argument block for every launch but the key
    // block the main kernel starts at, and every key block taken.
    let splits = a.dq_splits as i128;
    let key_blocks = round_up(f.seqlen_k as i128, block_n) / block_n;
    let row_grid = rows.grid.map(i128::from);
    m.check(row_grid == [round_up(f.seqlen_q as i128, 16) / 16, heads, batch], || format!("row grid {row_grid:?}"));
    m.fits("row grid x", row_grid[0], 1..=GRID_X);
    // The main kernel's grid: the sm_80 kernel's over its key blocks (per
    // group of `dq_splits` in the deterministic mode), the sm_90a kernel's
    // checked with its tensor maps.
    let key_grid = launches[1].grid.map(i128::from);
    match plan {
        BackwardPlan::Sm80(p) => {
            let grid_x = if splits > 0 { splits } else { key_blocks };
            let expected = [grid_x, heads / (f.heads_per_kv as i128).max(1), batch];
            m.check(key_grid == expected, || format!("key grid {key_grid:?}"));
            m.fits("key grid x", key_grid[0], 1..=GRID_X);
            m.check(p.key_launches as i128 * key_grid[0] >= key_blocks, || "key blocks no launch takes".into());
        }
        BackwardPlan::Sm90(p) => hopper_backward(m, p, &launches[1], a),
    }
    m.fits("grid y", heads, 1..=GRID_YZ);
    m.fits("grid z", batch, 1..=GRID_YZ);
    m.fits("heads_per_kv", f.heads_per_kv as i128, 1..=heads);
    for i in 1..n - 1 {
        let Some(launch) = args(i) else { return m.check(false, || format!("launch {i}'s arguments")) };
        let first = launch.first_key_block as i128;
        m.check(first == (i as i128 - 1) * key_grid[0], || format!("launch {i} starts at key block {first}"));
        m.fits("a launch's last key block", first + key_grid[0] - 1, U32);
        let same = BackwardParams { first_key_block: 0, ..launch };
        m.check(format!("{same:?}") == format!("{a:?}"), || format!("launch {i}'s arguments differ"));
    }
    let accum_splits = splits.max(1);
    let factors = [f.scale_log2, f.softcap_scale, f.softcap_log2, a.softmax_scale];
    m.check(factors.iter().all(|x| x.is_finite()), || format!("the folded factors {factors:?}"));
    let batches: Vec<i128> = if per_batch_data { (0..batch).collect() } else { vec![0, batch - 1] };
    for b in batches {
        if !m.failures.is_empty() {
            return;
        }
        let (mut sq, mut sk) = (f.seqlen_q as i128, f.seqlen_k as i128);
        let (mut q_start, mut k_start, mut lse) = (None, None, b * f.lse_batch_stride as i128);
        if !f.cu_seqlens_q.is_null() {
            let (start, end) = (m.read("cu_seqlens_q", b), m.read("cu_seqlens_q", b + 1));
            (q_start, sq) = (Some(start), end - start);
            lse += start;
        }
        if !f.cu_seqlens_k.is_null() {
            let (start, end) = (m.read("cu_seqlens_k", b), m.read("cu_seqlens_k", b + 1));
            (k_start, sk) = (Some(start), end - start);
        }
        m.fits("a sequence's queries", sq, 0..=f.seqlen_q as i128);
        m.fits("a sequence's keys", sk, 0..=f.seqlen_k as i128);
        let (h, kv_h) = (heads - 1, (heads - 1) / (f.heads_per_kv as i128).max(1));
        let first = |start: Option<i128>, [batch_stride, row_stride]: [i64; 2]| match start {
            Some(start) => start * row_stride as i128,
            None => b * batch_stride as i128,
        };
        if sq > 0 {
            for (name, strides) in [
                ("q", [f.q_batch_stride, f.q_row_stride, f.q_head_stride]),
                ("o", [f.o_batch_stride, f.o_row_stride, f.o_head_stride]),
                ("d_o", [a.d_o_batch_stride, a.d_o_row_stride, a.d_o_head_stride]),
                ("d_q", [a.d_q_batch_stride, a.d_q_row_stride, a.d_q_head_stride]),
            ] {
                m.rows(name, first(q_start, [strides[0], strides[1]]), &[(sq - 1, strides[1]), (h, strides[2])], d);
                if sq > 1 && matches!(name, "q" | "d_o") {
                    m.fits("q and dO tile row offsets", (sq.min(block_m) - 1) * strides[1] as i128 + d - 1, U32);
                }
            }
            m.touch("lse", lse, &[(h, f.lse_head_stride), (sq - 1, 1)]);
            m.touch("delta (scratch)", lse, &[(h, f.lse_head_stride), (sq - 1, 1)]);
            let accum = [
                (accum_splits - 1, a.d_q_accum_split_stride),
                (h, f.lse_head_stride * d as i64),
                (sq - 1, d as i64),
                (d - 1, 1),
            ];
            m.touch("d_q_accum (scratch)", lse * d, &accum);
            let last = (lse + h * f.lse_head_stride as i128 + sq - 1) * d + d - 1;
            m.check(splits == 0 || last < a.d_q_accum_split_stride as i128, || {
                format!("accumulator element {last} of a split past its stride {}", a.d_q_accum_split_stride)
            });
            m.fits("the row kernels' last row", round_up(sq, ROW_KERNEL_ROWS as i128) - 1, I32);
        }
        if sk > 0 {
            for (name, strides) in [
                ("k", [f.k_batch_stride, f.k_row_stride, f.k_head_stride]),
                ("v", [f.v_batch_stride, f.v_row_stride, f.v_head_stride]),
                ("d_k", [a.d_k_batch_stride, a.d_k_row_stride, a.d_k_head_stride]),
                ("d_v", [a.d_v_batch_stride, a.d_v_row_stride, a.d_v_head_stride]),
            ] {
                m.rows(name, first(k_start, [strides[0], strides[1]]), &[(sk - 1, strides[1]), (kv_h, strides[2])], d);
                if sk > 1 {
                    m.fits("k, v, dK and dV tile row offsets", (sk.min(block_n) - 1) * strides[1] as i128 + d - 1, U32);
                }
            }
        }
        if !f.alibi_slopes.is_null() && sq > 0 {
            m.touch("alibi_slopes", b * f.alibi_batch_stride as i128, &[(h, 1)]);
        }
        // Positions in i32 (problem.rs, softmax.rs), as in the forward.
        positions(m, round_up(sq.max(1), block_m), round_up(sk.max(1), block_n), sk - sq);
    }
}

/// The sm_90a main kernel of a backward plan (`kernels/src/backward/sm90`;
/// [`backward`] checks the rows it reads and writes, as the sm_80 kernel's):
/// a dense, non-deterministic call; its grid of 128-key blocks; the tensor
/// maps it loads q, k, v and dO through (each within its tensor, as the
/// call's strides say), uploaded inside the scratch.
fn hopper_backward(m: &mut Model, h: &Sm90Backward, launch: &Launch, a: BackwardParams) {
    let KernelArgs::HopperBackward(params) = launch.args else {
        return m.check(false, || format!("the sm_90a backward kernel got {:?}", launch.args));
    };
    let f = a.forward;
    m.check(a.dq_splits == 0 && f.cu_seqlens_q.is_null() && f.cu_seqlens_k.is_null(), || {
        "an sm_90a backward of packed sequences or the deterministic mode".into()
    });
    m.check(params.tensor_maps as u64 == SCRATCH + h.tensor_maps as u64, || "tensor maps".into());
    m.check(h.tensor_maps >= h.rows.end, || "the tensor maps over the accumulator".into());
    m.check(h.tensor_maps + size_of::<HopperBackwardScratch>() <= h.scratch_bytes(), || {
        "the tensor maps past the scratch".into()
    });
    let (batch, heads, d) = (f.batch as i128, f.heads_q as i128, h.kernel.head_dim as i128);
    let block_n = h.kernel.config.block_n() as i128;
    let grid = launch.grid.map(i128::from);
    let key_blocks = round_up(f.seqlen_k as i128, block_n) / block_n;
    m.check(grid == [key_blocks, heads / (f.heads_per_kv as i128).max(1), batch], || format!("grid {grid:?}"));
    m.fits("grid x", grid[0], 1..=GRID_X);
    tensor_maps(m, &h.maps, ["q", "k", "v", "d_o"], d);
}

/// The tensor maps an sm_90a kernel loads through, each named after its
/// tensor: valid, 4-D over rows of `d` elements, every row they reach
/// (boxes past a tensor's end are zero-filled, reading nothing) within the
/// tensor, as the call's strides say.
fn tensor_maps<const N: usize>(m: &mut Model, maps: &[TensorMapParams; N], names: [&'static str; N], d: i128) {
    for (map, name) in maps.iter().zip(names) {
        m.check(map.validate().is_ok(), || format!("{name}'s tensor map {map:?}"));
        m.check(map.rank == 4 && map.global_dims[0] as i128 == d, || format!("{name}'s tensor map {map:?}"));
        m.pointer(name, map.global_address, name);
        // Element strides of dimensions 1..4 (seqlen, heads, batch).
        let terms: Vec<(i128, i64)> =
            (1..4).map(|i| (map.global_dims[i] as i128 - 1, (map.global_strides[i - 1] / 2) as i64)).collect();
        m.rows(name, 0, &terms, d);
    }
}

/// The sm_90a kernel of a plan (`kernels/src/forward/sm90`), launched with its
/// outputs and scratch bound: the tensor maps it loads q, k and v through
/// (each within its tensor, as the call's strides say; boxes past a
/// tensor's end are zero-filled, reading nothing), the rows of o and the
/// LSE it writes, the ALiBi slopes it reads.
fn hopper(m: &mut Model, plan: &Sm90Plan, outputs: OutputAddrs) {
    let h = plan;
    let launches = plan.launches(outputs, SCRATCH);
    let [launch] = launches.as_slice() else {
        return m.check(false, || format!("{} launches for one sm_90a kernel", launches.len()));
    };
    let KernelArgs::Hopper(params) = launch.args else {
        return m.check(false, || format!("the sm_90a kernel got {:?}", launch.args));
    };
    let a = params.forward;
    // The uploaded maps and counter, in the scratch; the counter where the
    // plan says.
    let uploaded = SCRATCH;
    m.check(params.tensor_maps as u64 == uploaded, || "tensor maps".into());
    m.check(size_of::<HopperScratch>() <= plan.scratch_bytes, || "the sm_90a scratch past the scratch".into());
    let counter = uploaded + offset_of!(HopperScratch, tile_counter) as u64;
    m.check(params.tile_counter.is_null() != h.tile_counter, || {
        format!("tile counter {:?} where the plan says {}", params.tile_counter, h.tile_counter)
    });
    m.check(params.tile_counter.is_null() || params.tile_counter as u64 == counter, || "tile counter".into());
    m.check(a.num_splits == 1, || "a split sm_90a plan".into());
    let (batch, heads, d) = (a.batch as i128, a.heads_q as i128, h.kernel.head_dim as i128);
    let grid = h.grid.map(i128::from);
    m.fits("grid x", grid[0], 1..=GRID_X);
    // Persistent blocks: at most one per tile (the config's query rows of
    // a head), the tiles counted in u32.
    let block_m = h.kernel.config.block_m() as i128;
    let query_blocks = round_up(a.seqlen_q as i128, block_m) / block_m;
    let tiles = query_blocks * heads * batch;
    m.fits("tiles", tiles, 1..=u32::MAX as i128);
    m.check((params.query_blocks as i128, params.tiles as i128) == (query_blocks, tiles), || {
        format!("{} query blocks and {} tiles given for {query_blocks} and {tiles}", params.query_blocks, params.tiles)
    });
    m.check(grid[0] <= tiles && grid[1..] == [1, 1], || format!("grid {grid:?} for {tiles} tiles"));
    m.check(params.blocks as i128 == grid[0], || format!("{} blocks given for a grid of {grid:?}", params.blocks));
    m.fits("heads_per_kv", a.heads_per_kv as i128, 1..=heads);
    tensor_maps(m, &h.maps, ["q", "k", "v"], d);
    m.pointer("o", a.o as u64, "o");
    m.pointer("lse", a.lse as u64, "lse");
    if a.cu_seqlens_q.is_null() {
        m.check(a.cu_seqlens_k.is_null(), || "packed keys of dense queries".into());
        let rows =
            [(batch - 1, a.o_batch_stride), (a.seqlen_q as i128 - 1, a.o_row_stride), (heads - 1, a.o_head_stride)];
        m.rows("o", 0, &rows, d);
        let lse = [(batch - 1, a.lse_batch_stride), (heads - 1, a.lse_head_stride), (a.seqlen_q as i128 - 1, 1)];
        m.touch("lse", 0, &lse);
    } else {
        // Packed sequences: the general kernel, both offsets, no cache; the
        // maps over one batch of every token. Each tile's sequence starts
        // at its offsets in the tensors, its rows within the longest.
        m.check(h.kernel.variant == Variant::General && !a.cu_seqlens_k.is_null(), || "packed sequences".into());
        m.check(a.seqused_k.is_null() && a.block_table.is_null(), || "an sm_90a call over a KV cache".into());
        m.check(h.maps.iter().all(|map| map.global_dims[3] == 1), || "packed maps over several batches".into());
        for b in 0..batch {
            let (start, end) = (m.read("cu_seqlens_q", b), m.read("cu_seqlens_q", b + 1));
            let (k_start, k_end) = (m.read("cu_seqlens_k", b), m.read("cu_seqlens_k", b + 1));
            m.fits("a sequence's queries", end - start, 0..=a.seqlen_q as i128);
            m.fits("a sequence's keys", k_end - k_start, 0..=a.seqlen_k as i128);
            m.fits("a sequence's first key", k_start, 0..=h.maps[1].global_dims[1] as i128);
            if end > start {
                let rows = [(end - start - 1, a.o_row_stride), (heads - 1, a.o_head_stride)];
                m.rows("o", start * a.o_row_stride as i128, &rows, d);
                m.touch("lse", start, &[(heads - 1, a.lse_head_stride), (end - start - 1, 1)]);
            }
        }
    }
    if !a.alibi_slopes.is_null() {
        m.pointer("alibi_slopes", a.alibi_slopes as u64, "alibi_slopes");
        m.touch("alibi_slopes", 0, &[(batch - 1, a.alibi_batch_stride), (heads - 1, 1)]);
    }
}

#[test]
fn validation_accepts_only_calls_in_bounds() {
    let mut runner = TestRunner::new(config());
    let stats = std::cell::RefCell::new(Stats::default());
    let result = runner.run(&spec(), |spec| {
        let stats = &mut *stats.borrow_mut();
        stats.cases += 1;
        let failures = match call(&spec) {
            Ok(accepted) => check(&accepted, stats).0,
            Err(e) => {
                stats.refused += 1;
                let name = format!("{e:?}").split(|c: char| !c.is_alphanumeric()).next().unwrap_or("").to_string();
                *stats.errors.entry(name).or_default() += 1;
                vec![]
            }
        };
        if failures.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(failures.join("\n")))
        }
    });
    let stats = stats.into_inner();
    eprintln!("{stats:#?}");
    if let Err(e) = result {
        panic!("{e}");
    }
    // The run checked what it claims to: every kind of call accepted, and refused.
    let cases = stats.cases;
    let accepted = cases - stats.refused;
    for (what, n) in [
        ("accepted", accepted),
        ("refused", stats.refused),
        ("dense", stats.dense),
        ("varlen", stats.varlen),
        ("dense cache", stats.cache_dense),
        ("paged cache", stats.cache_paged),
        ("appends", stats.appends),
        ("appends checked for conflicts", stats.append_conflicts_checked),
        ("split-KV", stats.split),
        ("GQA decode", stats.gqa_decode),
        ("general kernels", stats.general),
        ("sm_90a kernels", stats.sm90a),
        ("backward", stats.backward),
        ("deterministic backward", stats.deterministic),
    ] {
        assert!(n * 200 >= cases, "{what}: {n} of {cases} cases");
    }
    // The calls the sm_90a backward and the packed sm_90a calls are
    // narrower slices of the specs.
    for (what, n) in [("sm_90a backward kernels", stats.backward_sm90a), ("packed sm_90a calls", stats.sm90a_packed)] {
        assert!(n * 1000 >= cases, "{what}: {n} of {cases} cases");
    }
}

/// A call of contiguous tensors with exact buffers and no option.
fn plain(kind: Kind, dims: Dims) -> Spec {
    let tensor = TensorSpec { strides: Strides::Contiguous, len: Len::Exact, misalign: 0 };
    Spec {
        kind,
        dims,
        tensors: [tensor; 4],
        reshape: None,
        lse: (Len::Exact, 0),
        features: Features {
            causal: false,
            scale: None,
            softcap: None,
            window: (None, None),
            alibi: None,
            num_splits: None,
            wave: 132 * 6,
        },
        alias: None,
        gaps: [0; 12],
    }
}

/// The elements the model sees the kernels touch in an accepted call,
/// which it finds in bounds.
fn touched_in_bounds(spec: &Spec) -> HashMap<&'static str, (i128, i128)> {
    let accepted = call(spec).unwrap_or_else(|e| panic!("refused: {e}"));
    let (failures, touched) = check(&accepted, &mut Stats::default());
    assert!(failures.is_empty(), "{failures:?}");
    touched
}

#[test]
fn tensors_past_2_31_elements_are_indexed_in_64_bits() {
    let dims = |batch, seqlen, heads, head_dim| Dims {
        batch,
        seqlen_q: seqlen,
        seqlen_k: seqlen,
        heads_kv: heads,
        groups: 1,
        head_dim,
    };
    // q, k, v, o of 2^31 elements end at offset i32::MAX; one row more
    // ends past it, and three batches of 2^30 elements at 3 * 2^30 - 1.
    for (shape, last) in [
        ((1, 1 << 25, 1, 64), i32::MAX as i128),
        ((1, (1 << 25) + 1, 1, 64), (1 << 31) + 63),
        ((3, 1 << 21, 8, 64), 3 << 30),
    ] {
        let (b, s, h, d) = shape;
        let spec = plain(Kind::Dense, dims(b, s, h, d));
        let touched = touched_in_bounds(&spec);
        for name in ["q", "k", "v", "o"] {
            let last = if last == 3 << 30 { last - 1 } else { last };
            assert_eq!(touched[name].1, last, "{name} of {shape:?}");
        }
    }
    // A paged cache of 2^32 elements, its last page in use.
    let mut spec = plain(
        Kind::Cache {
            slots: 256,
            paged: Some((1 << 14, 4, vec![(3, (1 << 14) - 1)])),
            fill: vec![255; 8],
            seqlens: None,
            new: None,
        },
        dims(1, 1, 8, 128),
    );
    spec.dims.seqlen_k = 1;
    let touched = touched_in_bounds(&spec);
    assert_eq!(touched["k_cache"].1, (1i128 << 32) - 1);
}

#[test]
fn the_split_kv_merge_numbers_its_warps_in_32_bits() {
    // d = 256: 32 warps per merged row; 2^27 rows are 2^32 warps, the most.
    let spec = |seqlen_q| {
        let mut spec =
            plain(Kind::Dense, Dims { batch: 1, seqlen_q, seqlen_k: 64, heads_kv: 1, groups: 1, head_dim: 256 });
        spec.features.num_splits = Some(2);
        spec
    };
    let touched = touched_in_bounds(&spec(1 << 27));
    assert_eq!(touched["o_partial"].1, (2i128 << 27) * 256 - 1);
    let err = call(&spec((1 << 27) + 1)).err().expect("refused");
    assert_eq!(err, Error::TooLarge { what: "split-KV merge blocks", value: (1 << 30) + 8, max: 1 << 30 });
}

#[test]
fn the_bounds_model_finds_calls_out_of_bounds() {
    // Accepted calls, then broken as validation must not let them be.
    let dense =
        plain(Kind::Dense, Dims { batch: 2, seqlen_q: 100, seqlen_k: 70, heads_kv: 2, groups: 4, head_dim: 64 });
    let failures = |spec: &Spec, corrupt: &dyn Fn(&mut Accepted)| {
        let mut accepted = call(spec).unwrap_or_else(|e| panic!("refused: {e}"));
        assert!(check(&accepted, &mut Stats::default()).0.is_empty());
        corrupt(&mut accepted);
        check(&accepted, &mut Stats::default()).0.join("; ")
    };
    // One batch too far, a row stride past 32 bits, a key past i32.
    assert!(failures(&dense, &|a| a.plan.args.q_batch_stride += 8).contains("q: elements"));
    assert!(failures(&dense, &|a| a.plan.args.k_row_stride = 1 << 30).contains("k tile row offsets"));
    assert!(failures(&dense, &|a| a.plan.args.seqlen_k = i32::MAX as u32).contains("end of the last key block"));
    assert!(failures(&dense, &|a| a.plan.args.scale_log2 = f32::INFINITY).contains("folded factors"));
    // The lse over an input.
    assert!(failures(&dense, &|a| a.buffers[4].addr = a.buffers[0].addr).contains("lse is written but overlaps q"));
    // Two batches appending to one row of a dense cache (batch stride 0).
    let cache = |paged| Kind::Cache {
        slots: if paged { 64 } else { 100 },
        paged: paged.then(|| (8, 2, vec![])),
        fill: vec![100; 8],
        seqlens: None,
        new: Some((2, dense.tensors[0], dense.tensors[0])),
    };
    let appending =
        plain(cache(false), Dims { batch: 2, seqlen_q: 1, seqlen_k: 1, heads_kv: 2, groups: 2, head_dim: 64 });
    let shared = failures(&appending, &|a| a.plan.append.as_mut().unwrap().params.k_cache_strides[0] = 0);
    assert!(shared.contains("k_cache: batch 0 appends its key"), "{shared}");
    // A paged append over a row another batch reads.
    let mut paged = appending.clone();
    paged.kind = cache(true);
    let shared = failures(&paged, &|a| {
        let table = a.buffers.iter_mut().find(|b| b.name == "block_table").unwrap();
        table.values[2] = table.values[0];
    });
    assert!(shared.contains("that batch 0 reads") || shared.contains("that batch 1 reads"), "{shared}");
    // An append grid past the launch limit.
    assert!(failures(&appending, &|a| a.plan.append.as_mut().unwrap().grid[0] = u32::MAX).contains("append grid x"));
}

#[test]
fn public_checks_never_panic_and_describe_their_input() {
    let mut runner = TestRunner::new(config());
    let i32s = || proptest::collection::vec(prop_oneof![4 => 0..100i32, 1 => any::<i32>()], 0..8);
    let lengths = proptest::collection::vec(prop_oneof![4 => 0..100usize, 1 => select(size_extremes())], 0..8);
    let sizes = (any::<usize>(), any::<usize>(), any::<usize>());
    let shape = [1..4usize, 1..4usize, 1..4usize, 1..4usize];
    let strides = [0..40usize, 0..40usize, 0..40usize, 0..3usize];
    let extreme = || prop_oneof![select(size_extremes()), any::<usize>()];
    let huge = [extreme(), extreme(), extreme(), extreme()];
    let inputs = (i32s(), lengths, i32s(), sizes, (shape, strides), (huge.clone(), huge));
    let result = runner.run(&inputs, |input| {
        let (offsets, lengths, seqlens, (a, b, c), (shape, strides), (huge, huge_strides)) = input;
        // Sequence offsets: from 0, never decreasing.
        match check_seq_offsets(&offsets) {
            Ok(summary) => {
                prop_assert!(offsets[0] == 0 && offsets.windows(2).all(|w| w[0] <= w[1]));
                let max_len = offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max();
                prop_assert_eq!((summary.batch, summary.total), (offsets.len() - 1, *offsets.last().unwrap() as usize));
                prop_assert_eq!(Some(summary.max_len), max_len);
            }
            Err(e) => prop_assert!(matches!(e, Error::InvalidSeqOffsets(_))),
        }
        let total: u128 = lengths.iter().map(|&n| n as u128).sum();
        match offsets_from_lengths(&lengths) {
            Ok(offsets) if lengths.is_empty() => prop_assert_eq!(offsets, vec![0]),
            Ok(offsets) => {
                let summary = check_seq_offsets(&offsets).unwrap();
                prop_assert_eq!((summary.batch, summary.total as u128), (lengths.len(), total));
            }
            Err(e) => {
                let too_large = matches!(e, Error::TooLarge { .. });
                prop_assert!(too_large && total > i32::MAX as u128);
            }
        }
        let valid = !seqlens.is_empty() && seqlens.iter().all(|&n| n >= 0);
        prop_assert_eq!(check_cache_seqlens(&seqlens).is_ok(), valid);
        match check_block_table_shape(a, b) {
            Ok(rows) => prop_assert!(b > 0 && rows > 0 && rows * b == a),
            Err(_) => prop_assert!(b == 0 || a == 0 || a % b != 0),
        }
        prop_assert!((1..=MAX_SPLITS).contains(&num_splits_heuristic(a, b, c)));
        // Layouts: small ones against every index, huge ones only never panic.
        let layout = Layout::strided(shape, strides);
        let offsets: Vec<usize> = (0..shape.iter().product::<usize>())
            .map(|mut i| {
                (0..4)
                    .rev()
                    .map(|dim| {
                        let index = i % shape[dim];
                        i /= shape[dim];
                        index * strides[dim]
                    })
                    .sum()
            })
            .collect();
        let span = offsets.iter().max().map_or(0, |&last| last + 1);
        prop_assert_eq!(layout.span(), Some(span));
        let mut distinct = offsets.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // Sound (never true for overlapping elements), if not exact.
        prop_assert!(!layout.is_non_overlapping() || distinct.len() == offsets.len());
        let huge = Layout::strided(huge, huge_strides);
        let _ = (huge.span(), huge.elements(), huge.is_non_overlapping(), Layout::contiguous(huge.shape).span());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
