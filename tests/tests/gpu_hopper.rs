//! The sm_90a kernels on an H100 or H200, against the f64 CPU reference,
//! and beside the sm_80 kernels (`FlashAttention::portable`) on the same
//! inputs: every row of the sm_90a table over ragged query and key counts,
//! GQA and MQA, padded and heads-major layouts, causal with more queries
//! than keys and the reverse, and for the general kernels windows and
//! softcaps (ALiBi: gpu_features, and the emulator). Each case first asks the host's planner
//! which kernel it runs, so a case that silently fell back to the sm_80
//! kernels fails. Skipped, saying why, without a GPU of compute capability
//! 9.0; on one, the sm_90a kernels must be loaded.

use flash_attn::cust::context::CurrentContext;
use flash_attn::cust::device::DeviceAttribute;
use flash_attn::pipeline::{plan_for, sm90_block_m, validate, KernelFamily, OutputBuffers, Plan};
use flash_attn::{AttentionKernel, Element, Family, FlashAttention, HOPPER_KERNELS};
use flash_attn_abi::kernels::Variant;
use flash_attn_tests::emulator::{self, Memory};
use flash_attn_tests::seed::test_rng;
use flash_attn_tests::{
    check_with, f16_and_bf16_tests, gpu, launch_explained, left_out_of_this_run, random_inputs, skipped, Case,
    Modifiers, Placement, TestElement,
};

/// The kernel the host plans for `case` on compute capability 9.0, and the
/// heads whose causal tiles it interleaves: the call validated at host
/// addresses of the same alignment (16 bytes) and strides as the device
/// buffers, planned for [`KernelFamily::Sm90a`].
fn planned_kernel<T: TestElement>(case: &Case, modifiers: Modifiers) -> (String, u32) {
    let dtype = <T as Element>::DTYPE;
    let tensor = |shape: [usize; 4]| emulator::Tensor::filled(shape, case.placement.strides(shape), 0);
    let q_shape = [case.batch, case.seqlen_q, case.heads_q, case.head_dim];
    let kv_shape = [case.batch, case.seqlen_k, case.heads_kv, case.head_dim];
    let (q, k, v, mut o) = (tensor(q_shape), tensor(kv_shape), tensor(kv_shape), tensor(q_shape));
    let mut lse = vec![0f32; case.batch * case.heads_q * case.seqlen_q];
    let mut memory = Memory::new();
    let (q, k, v) = (memory.tensor("q", &q), memory.tensor("k", &k), memory.tensor("v", &v));
    let o = memory.output_tensor("o", &mut o);
    let lse_len = lse.len();
    let lse_addr = memory.output("lse", &mut lse);
    let call = validate(dtype, &q, &k, &v, OutputBuffers::Given { o: &o, lse_addr, lse_len }, &case.params(modifiers))
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let plan = plan_for(&call, |_: &AttentionKernel| 1, KernelFamily::Sm90a { sm_count: 132 }).expect("a plan");
    match plan {
        Plan::Sm90(plan) => (plan.kernel.name.to_string(), plan.section_heads),
        Plan::Sm80(plan) => (plan.kernel.name.to_string(), 1),
    }
}

/// A causal case whose 16 heads (of both batches) take two sections of 8
/// (their K and V, 2 MiB a head at every head dim, fill the 25 MB a
/// section may by 12 heads; 8 divide 16).
fn sections_case(head_dim: usize) -> Case {
    let seqlen_k = 8192 * 64 / head_dim;
    Case {
        batch: 2,
        seqlen_q: 130,
        seqlen_k,
        heads_q: 8,
        heads_kv: 2,
        head_dim,
        causal: true,
        softmax_scale: None,
        placement: Placement::Contiguous,
    }
}

/// The cases of one head dim, causal or not: (batch, seqlen_q, seqlen_k,
/// heads_q, heads_kv, placement).
fn cases(head_dim: usize, causal: bool) -> Vec<Case> {
    let shapes = [
        (2, 1000, 1000, 4, 1, Placement::Contiguous),
        (1, 300, 1500, 2, 2, Placement::Padded),
        (1, 1500, 300, 6, 1, Placement::HeadsMajor),
        (3, 129, 255, 2, 1, Placement::Contiguous),
        (1, 17, 4097, 2, 2, Placement::Padded),
        (1, 4096, 4096, 2, 1, Placement::Contiguous),
        // 320 tiles of 17 rows over 40 keys: more than an H100's 132 SMs,
        // so each persistent block takes two or three (and small enough
        // for the sanitizers' case cap).
        (20, 17, 40, 16, 4, Placement::Padded),
    ];
    let mut cases: Vec<Case> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, placement))| Case {
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
            causal,
            softmax_scale: if i == 3 { Some(0.3) } else { None },
            placement,
        })
        .collect();
    if causal {
        cases.push(sections_case(head_dim));
    }
    cases
}

fn run<T: TestElement>(test: &str) {
    let Some((_context, attention)) = gpu(test) else {
        return;
    };
    let device = CurrentContext::get_device().expect("device");
    let major = device.get_attribute(DeviceAttribute::ComputeCapabilityMajor).expect("major");
    let minor = device.get_attribute(DeviceAttribute::ComputeCapabilityMinor).expect("minor");
    if (major, minor) != (9, 0) {
        skipped(test, &format!("GPU has compute capability {major}.{minor}; the sm_90a kernels need 9.0"));
        return;
    }
    assert!(attention.uses_sm90a(), "compute capability 9.0, but the sm_90a kernels were not loaded");
    let portable = FlashAttention::portable().expect("the sm_80 kernels");
    assert!(!portable.uses_sm90a());
    let mut rng = test_rng(test);
    let dtype = <T as Element>::DTYPE;
    for kernel in HOPPER_KERNELS.iter().filter(|k| k.dtype == dtype) {
        let (d, rows) = (kernel.head_dim, kernel.config.block_m());
        let general = kernel.variant == Variant::General;
        // d = 64's causal and general kernels come with two tile heights:
        // 128 rows for causal calls over at most 1024 keys, else 192.
        let short_causal = rows != sm90_block_m(d, false, usize::MAX);
        let cases: Vec<_> = cases(d as usize, kernel.variant == Variant::Causal)
            .into_iter()
            .enumerate()
            .map(|(i, mut case)| {
                // The general kernel: windows on one or both sides, a
                // softcap, alone and with the causal mask.
                let modifiers = match (general, short_causal, i % 3) {
                    (false, ..) => Modifiers::default(),
                    (true, true, _) | (true, false, 1) => Modifiers { window: (None, None), softcap: Some(6.0) },
                    (true, false, 0) => Modifiers { window: (Some(100), Some(40)), softcap: None },
                    (true, false, _) => Modifiers { window: (Some(300), None), softcap: Some(20.0) },
                };
                case.causal |= general && (short_causal || i % 2 == 1);
                (case, modifiers)
            })
            .filter(|(case, modifiers)| {
                let causal_mask = case.causal && modifiers.window == (None, None);
                sm90_block_m(d, causal_mask, case.seqlen_k) == rows
            })
            .collect();
        assert!(cases.len() >= 2, "{}: {} cases", kernel.name, cases.len());
        for (case, modifiers) in cases {
            let (planned, section_heads) = planned_kernel::<T>(&case, modifiers);
            assert_eq!(planned, kernel.name, "{case:?} {modifiers:?}: planned for another kernel");
            if case == sections_case(d as usize) {
                assert_eq!(section_heads, 8, "{case:?}: not the sections the case is for");
            }
            if left_out_of_this_run(test, &case, case.batch * case.heads_q * case.seqlen_q * case.seqlen_k) {
                continue;
            }
            let inputs = random_inputs::<T>(&case, &mut rng);
            // explain_forward, on the call's own buffers, names the kernel
            // the planner chose: the sm_90a one, and an sm_80 one on the
            // portable kernels.
            let (explained, o, lse) = launch_explained(&attention, &case, modifiers, &inputs);
            assert_eq!((explained.family, explained.kernel), (Family::Sm90a, kernel.name), "{case:?}: explained");
            assert_eq!(explained.launches.len(), 1, "{case:?}: {explained}");
            let ours = check_with(&case, modifiers, &inputs, &o, &lse);
            let (explained80, o80, lse80) = launch_explained(&portable, &case, modifiers, &inputs);
            assert_eq!(explained80.family, Family::Sm80, "{case:?}: {explained80}");
            assert!(explained80.kernel.starts_with(&format!("flash_fwd_d{d}_")), "{case:?}: {explained80}");
            let theirs = check_with(&case, modifiers, &inputs, &o80, &lse80);
            println!(
                "{test}: ok {} sq={} sk={} heads={}:{} {:?} {modifiers:?}: O rel err {:.2e} (sm_80 {:.2e}), LSE max err {:.2e} (sm_80 {:.2e})",
                kernel.name,
                case.seqlen_q,
                case.seqlen_k,
                case.heads_q,
                case.heads_kv,
                case.placement,
                ours.o_error,
                theirs.o_error,
                ours.lse_max_error,
                theirs.lse_max_error
            );
        }
    }
}

f16_and_bf16_tests!(sm90a_kernels_f16, sm90a_kernels_bf16: run());
