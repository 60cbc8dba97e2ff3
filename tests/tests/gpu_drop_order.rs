//! Dropping the CUDA context before our values must not crash: a program
//! that keeps the context in a struct field declared before its
//! `FlashAttention`, `Workspace`, `Output` and `Stream` drops them in that
//! order (struct fields drop in declaration order). The worst order runs in
//! a child process, because a crash there ends the process at exit, after
//! every assertion passed.

use std::process::Command;

use flash_attn::cust::context::Context;
use flash_attn::cust::memory::DeviceBuffer;
use flash_attn::cust::stream::{Stream, StreamFlags};
use flash_attn::half1::f16;
use flash_attn::{AttentionParams, CacheSeqlens, FlashAttention, KvCache, Output, Tensor, Workspace};
use flash_attn_tests::gpu;

/// Set in the child's environment: run the worst order and exit.
const CHILD: &str = "FLASH_ATTN_DROP_ORDER_CHILD";

/// Everything a decode loop holds, the context first, so it drops first.
/// (cust's own `Stream` and `DeviceBuffer` hold no reference on the
/// context: they are freed in it only while one of ours keeps it alive, so
/// they come before the last of ours.)
struct WorstOrder {
    _context: Context,
    _attention: FlashAttention,
    _stream: Stream,
    _cache: [DeviceBuffer<f16>; 3],
    _workspace: Workspace,
    _output: Output<f16>,
}

/// Runs a dense call and a KV cache call that fills `Workspace` (split-KV
/// partial outputs), checks the outputs, then drops everything with the
/// context first.
fn worst_order() {
    let Some((context, attention)) = gpu("worst_order_child") else {
        panic!("the parent found a GPU, the child none");
    };
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let (batch, seqlen, heads, d) = (1, 64, 2, 64);
    let shape = [batch, seqlen, heads, d];
    let values: Vec<f16> =
        (0..batch * seqlen * heads * d).map(|i| f16::from_f32(((i % 7) as f32 - 3.0) / 4.0)).collect();
    let q = DeviceBuffer::from_slice(&values).unwrap();
    let output = attention
        .forward(
            Tensor::new(&q, shape),
            Tensor::new(&q, shape),
            Tensor::new(&q, shape),
            &AttentionParams::default(),
            &stream,
        )
        .unwrap();
    // One query over a long cache, with enough keys that the split-KV
    // heuristic splits it: the workspace allocates.
    let capacity = 8192;
    let cache = DeviceBuffer::from_slice(&vec![f16::from_f32(0.25); capacity * heads * d]).unwrap();
    let seqlens = CacheSeqlens::new(&[capacity as i32]).unwrap();
    let mut workspace = Workspace::new();
    let decode = attention
        .forward_kvcache(
            Tensor::new(&q, [1, 1, heads, d]),
            KvCache::new(
                Tensor::new(&cache, [1, capacity, heads, d]),
                Tensor::new(&cache, [1, capacity, heads, d]),
                &seqlens,
            ),
            &AttentionParams { num_splits: Some(4), ..Default::default() },
            &mut workspace,
            &stream,
        )
        .unwrap();
    stream.synchronize().unwrap();
    assert!(workspace.capacity() > 0, "the split-KV call used no workspace");
    let o: Vec<f16> = output.o.as_host_vec().unwrap();
    assert!(o.iter().all(|x| x.to_f32().is_finite()), "dense output has non-finite values");
    // Every cached value is 0.25, so the decode output is 0.25 everywhere.
    let decoded: Vec<f16> = decode.o.as_host_vec().unwrap();
    assert!(decoded.iter().all(|x| (x.to_f32() - 0.25).abs() < 1e-3), "decode output is not 0.25");
    drop(decode);
    let values = WorstOrder {
        _context: context,
        _attention: attention,
        _stream: stream,
        _cache: [q, cache, DeviceBuffer::from_slice(&values).unwrap()],
        _workspace: workspace,
        _output: output,
    };
    drop(values);
    eprintln!("worst order: dropped everything, context first");
}

#[test]
fn dropping_the_context_first_does_not_crash() {
    if std::env::var_os(CHILD).is_some() {
        worst_order();
        return;
    }
    if gpu("dropping_the_context_first_does_not_crash").is_none() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["dropping_the_context_first_does_not_crash", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("cannot start the child test process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the child exited with {}:\n{stdout}\n{stderr}", out.status);
    assert!(stderr.contains("worst order: dropped everything"), "the child did not run the worst order:\n{stderr}");
}
