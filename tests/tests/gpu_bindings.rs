//! The front doors and what a program around them does: the cust, cudarc
//! and raw doors give the same bits for the same call (cust's checked
//! against the f64 reference), one `FlashAttention` serves several threads
//! on their own streams, and a decode step captured into a CUDA graph
//! replays as the eager call runs. Skipped, saying why, without a GPU.

use flash_attn_tests::seed::test_rng;
use std::sync::Arc;

use flash_attn::cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use flash_attn::{
    f16, AttentionParams, CacheSeqlens, DeviceView, DeviceViewMut, FlashAttention, KvCache, RawStream, Tensor,
    TensorMut, Workspace,
};
use flash_attn_tests::{check, gpu, launch, random_inputs, Case, HostTensor, Placement};
use rand::Rng;

/// The GQA, ragged, strided call the doors are compared on (small enough
/// for every sanitizer: 155k scores).
const CASE: Case = Case {
    batch: 1,
    seqlen_q: 150,
    seqlen_k: 257,
    heads_q: 4,
    heads_kv: 1,
    head_dim: 128,
    causal: true,
    softmax_scale: None,
    placement: Placement::HeadsMajor,
};

/// The cudarc context of GPU 0, current on this thread, and the kernels
/// loaded into it.
fn cudarc_gpu(test: &str) -> Option<(Arc<CudaContext>, Arc<FlashAttention>)> {
    // `gpu` says why and returns None without a usable GPU; cudarc panics
    // without a driver, so it is asked only after.
    gpu(test)?;
    let context = CudaContext::new(0).expect("cudarc context");
    let attention = FlashAttention::new().expect("loading the kernels into cudarc's context");
    Some((context, Arc::new(attention)))
}

/// A host tensor's buffer as half 2 values on `stream`.
fn upload(stream: &Arc<CudaStream>, t: &HostTensor<flash_attn::half1::f16>) -> CudaSlice<f16> {
    let values: Vec<f16> = t.buffer.iter().map(|x| f16::from_bits(x.to_bits())).collect();
    stream.clone_htod(&values).expect("upload")
}

fn poisoned(stream: &Arc<CudaStream>, n: usize) -> CudaSlice<f16> {
    stream.clone_htod(&vec![f16::NAN; n]).expect("poisoned o")
}

fn bits(stream: &Arc<CudaStream>, values: &CudaSlice<f16>) -> Vec<u16> {
    stream.clone_dtoh(values).expect("download").iter().map(|x| x.to_bits()).collect()
}

fn lse_bits(stream: &Arc<CudaStream>, values: &CudaSlice<f32>) -> Vec<u32> {
    stream.clone_dtoh(values).expect("download lse").iter().map(|x| x.to_bits()).collect()
}

#[test]
fn cust_cudarc_and_raw_doors_give_the_same_bits() {
    let test = "cust_cudarc_and_raw_doors_give_the_same_bits";
    let Some((_cust_context, cust_attention)) = gpu(test) else { return };
    let mut rng = test_rng(test);
    let inputs = random_inputs::<flash_attn::half1::f16>(&CASE, &mut rng);
    // The cust door, against the f64 reference.
    let (o_cust, lse_cust) = launch(&cust_attention, &CASE, &inputs);
    check(&CASE, &inputs, &o_cust, &lse_cust);
    drop(cust_attention);

    let (context, attention) = cudarc_gpu(test).expect("a GPU");
    let stream = context.new_stream().expect("stream");
    let (q, k, v) = (upload(&stream, &inputs.q), upload(&stream, &inputs.k), upload(&stream, &inputs.v));
    let o_shape = inputs.q.shape;
    let o_strides = CASE.placement.strides(o_shape);
    let o_len = flash_attn_tests::span(o_shape, o_strides);
    let lse_len = CASE.batch * CASE.heads_q * CASE.seqlen_q;
    let params = AttentionParams { causal: CASE.causal, num_splits: Some(1), ..Default::default() };

    // The cudarc door.
    let mut o = poisoned(&stream, o_len);
    let mut lse = stream.clone_htod(&vec![f32::NAN; lse_len]).expect("lse");
    attention
        .forward_into(
            Tensor::strided(&q, inputs.q.shape, inputs.q.strides),
            Tensor::strided(&k, inputs.k.shape, inputs.k.strides),
            Tensor::strided(&v, inputs.v.shape, inputs.v.strides),
            TensorMut::strided(&mut o, o_shape, o_strides),
            &mut lse,
            &params,
            &stream,
        )
        .expect("cudarc door");
    let (o_cudarc, lse_cudarc) = (bits(&stream, &o), lse_bits(&stream, &lse));

    // The raw door: device pointers and a CUstream.
    let mut o_raw = poisoned(&stream, o_len);
    let mut lse_raw = stream.clone_htod(&vec![f32::NAN; lse_len]).expect("lse");
    {
        let raw = |m: &CudaSlice<f16>| unsafe { DeviceView::<f16>::from_raw(m.device_ptr(&stream).0, m.len()) };
        let o_view = unsafe { DeviceViewMut::<f16>::from_raw(o_raw.device_ptr_mut(&stream).0, o_len) };
        let lse_view = unsafe { DeviceViewMut::<f32>::from_raw(lse_raw.device_ptr_mut(&stream).0, lse_len) };
        let raw_stream = unsafe { RawStream::from_raw(stream.cu_stream().cast()) };
        attention
            .forward_into(
                Tensor::strided(raw(&q), inputs.q.shape, inputs.q.strides),
                Tensor::strided(raw(&k), inputs.k.shape, inputs.k.strides),
                Tensor::strided(raw(&v), inputs.v.shape, inputs.v.strides),
                TensorMut::strided(o_view, o_shape, o_strides),
                lse_view,
                &params,
                &raw_stream,
            )
            .expect("raw door");
    }
    let (o_from_raw, lse_from_raw) = (bits(&stream, &o_raw), lse_bits(&stream, &lse_raw));

    // Same bits everywhere the output is (the padding stays poisoned).
    let o_gathered: Vec<f64> = flash_attn_tests::gather(
        &o_cudarc.iter().map(|&b| flash_attn::half1::f16::from_bits(b)).collect::<Vec<_>>(),
        o_shape,
        o_strides,
    );
    let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same(&o_gathered, &o_cust), "cudarc door's O differs from cust door's");
    assert_eq!(o_cudarc, o_from_raw, "raw door's O differs from cudarc door's");
    let lse_cust_bits: Vec<u32> = lse_cust.iter().map(|x| x.to_bits()).collect();
    assert_eq!(lse_cudarc, lse_cust_bits, "cudarc door's LSE differs from cust door's");
    assert_eq!(lse_from_raw, lse_cust_bits, "raw door's LSE differs from cust door's");
}

#[test]
fn cudarc_memory_with_a_foreign_stream_is_refused() {
    let test = "cudarc_memory_with_a_foreign_stream_is_refused";
    let Some((context, attention)) = cudarc_gpu(test) else { return };
    let stream = context.new_stream().expect("stream");
    let shape = [1, 64, 2, 64];
    let n: usize = shape.iter().product();
    let q = stream.clone_htod(&vec![f16::ONE; n]).expect("q");
    let mut o = stream.alloc_zeros::<f16>(n).expect("o");
    let mut lse = stream.alloc_zeros::<f32>(128).expect("lse");
    let raw_stream = unsafe { RawStream::from_raw(stream.cu_stream().cast()) };
    let err = attention
        .forward_into(
            Tensor::new(&q, shape),
            Tensor::new(&q, shape),
            Tensor::new(&q, shape),
            TensorMut::new(&mut o, shape),
            &mut lse,
            &AttentionParams::default(),
            &raw_stream,
        )
        .unwrap_err();
    assert_eq!(err, flash_attn::Error::MixedBindings { tensor: "q" });
}

/// A call's outputs as bits: O and the LSE.
type Bits = (Vec<u16>, Vec<u32>);

/// One call of `shape` on `stream`.
fn call_on(attention: &FlashAttention, stream: &Arc<CudaStream>, qkv: &[CudaSlice<f16>; 3], shape: [usize; 4]) -> Bits {
    let n: usize = shape.iter().product();
    let mut o = poisoned(stream, n);
    let mut lse = stream.clone_htod(&vec![f32::NAN; shape[0] * shape[1] * shape[2]]).expect("lse");
    attention
        .forward_into(
            Tensor::new(&qkv[0], shape),
            Tensor::new(&qkv[1], shape),
            Tensor::new(&qkv[2], shape),
            TensorMut::new(&mut o, shape),
            &mut lse,
            &AttentionParams { causal: true, ..Default::default() },
            &**stream,
        )
        .expect("call");
    (bits(stream, &o), lse_bits(stream, &lse))
}

#[test]
fn one_instance_serves_threads_on_their_own_streams() {
    let test = "one_instance_serves_threads_on_their_own_streams";
    let Some((context, attention)) = cudarc_gpu(test) else { return };
    let shape = [1, 333, 2, 64];
    let n: usize = shape.iter().product();
    let mut rng = test_rng(test);
    let threads = 4;
    // Per thread: its inputs and the result of one call made here first.
    let work: Vec<(Vec<f16>, Bits)> = (0..threads)
        .map(|_| {
            let values: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.gen_range(-2.0..2.0))).collect();
            let stream = context.default_stream();
            let qkv = [0, 1, 2].map(|_| stream.clone_htod(&values).expect("upload"));
            let expected = call_on(&attention, &stream, &qkv, shape);
            (values, expected)
        })
        .collect();
    std::thread::scope(|scope| {
        for (t, (values, expected)) in work.iter().enumerate() {
            let (attention, context) = (Arc::clone(&attention), Arc::clone(&context));
            scope.spawn(move || {
                let stream = context.new_stream().expect("stream");
                let qkv = [0, 1, 2].map(|_| stream.clone_htod(values).expect("upload"));
                for call in 0..8 {
                    let got = call_on(&attention, &stream, &qkv, shape);
                    assert!(got == *expected, "thread {t}, call {call}: result differs from the one-thread call");
                }
            });
        }
    });
}

#[test]
fn decode_step_replays_from_a_cuda_graph() {
    let test = "decode_step_replays_from_a_cuda_graph";
    let Some((context, attention)) = cudarc_gpu(test) else { return };
    // cudarc's per-slice events would be recorded into the graph; a
    // program that captures orders its memory on the one stream instead.
    unsafe { context.disable_event_tracking() };
    let stream = context.new_stream().expect("stream");
    let (batch, capacity, heads_q, heads_kv, d) = (3, 1024, 8, 2, 128);
    let mut rng = test_rng(test);
    let mut random = |n: usize| -> Vec<f16> { (0..n).map(|_| f16::from_f32(rng.gen_range(-1.0..1.0))).collect() };
    let cache_shape = [batch, capacity, heads_kv, d];
    let cache_len: usize = cache_shape.iter().product();
    let (k_cache, v_cache) =
        (stream.clone_htod(&random(cache_len)).unwrap(), stream.clone_htod(&random(cache_len)).unwrap());
    let q_shape = [batch, 1, heads_q, d];
    let mut q = stream.clone_htod(&random(batch * heads_q * d)).unwrap();
    let cache_seqlens = CacheSeqlens::new(&[1000, 517, 77]).unwrap();
    let mut o = poisoned(&stream, batch * heads_q * d);
    let mut lse = stream.alloc_zeros::<f32>(batch * heads_q).unwrap();
    let mut workspace = Workspace::new();
    // Split-KV: the step needs scratch, from the workspace.
    let params = AttentionParams { causal: true, num_splits: Some(4), ..Default::default() };
    let step = |o: &mut CudaSlice<f16>, lse: &mut CudaSlice<f32>, q: &CudaSlice<f16>, workspace: &mut Workspace| {
        let cache =
            KvCache::new(Tensor::new(&k_cache, cache_shape), Tensor::new(&v_cache, cache_shape), &cache_seqlens);
        attention
            .forward_kvcache_into(
                Tensor::new(q, q_shape),
                cache,
                TensorMut::new(o, q_shape),
                lse,
                &params,
                workspace,
                &stream,
            )
            .expect("decode step")
    };

    // Eager, which also grows the workspace to what the step needs.
    step(&mut o, &mut lse, &q, &mut workspace);
    let eager = (bits(&stream, &o), lse_bits(&stream, &lse));
    assert!(workspace.capacity() > 0, "a split decode step takes scratch from the workspace");

    // Thread-local: the other tests of this executable go on in their
    // threads (a global capture would refuse their synchronous calls).
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
    step(&mut o, &mut lse, &q, &mut workspace);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).expect("end capture").expect("a graph");

    // The replay writes fresh outputs, bit for bit the eager ones.
    stream.memcpy_htod(&vec![f16::NAN; batch * heads_q * d], &mut o).unwrap();
    graph.launch().expect("replay");
    assert!((bits(&stream, &o), lse_bits(&stream, &lse)) == eager, "the replay differs from the eager step");

    // A new query in the same buffer: the replay reads it.
    stream.memcpy_htod(&random(batch * heads_q * d), &mut q).unwrap();
    graph.launch().expect("replay");
    let replayed = (bits(&stream, &o), lse_bits(&stream, &lse));
    step(&mut o, &mut lse, &q, &mut workspace);
    assert!(replayed == (bits(&stream, &o), lse_bits(&stream, &lse)), "the replay on a new query differs from eager");
    assert!(replayed != eager, "a new query should change the output");
}
