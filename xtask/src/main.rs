//! Workspace tasks: `cargo xtask build-ptx [--check] [--require-ptxas]` and
//! `cargo xtask gpu-bundle`.

use flash_attn_abi::hopper::HOPPER_KERNELS;
use flash_attn_abi::hopper_backward::HOPPER_BACKWARD_KERNELS;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

mod divergence;

const PTX_TARGET: &str = "nvptx64-nvidia-cuda";
/// The PTX targets sm_80 and runs on A100, H100 and H200 (the driver
/// compiles it for the GPU at load).
const PTX_ARCH: &str = "sm_80";
/// Architectures ptxas checks the PTX for.
const PTXAS_ARCHES: &[&str] = &["sm_80", "sm_90"];
/// Committed PTX that `host` embeds: the attention kernels (the kernels
/// crate's default feature `attention`).
const COMMITTED_PTX: &str = "host/kernels.ptx";
/// Committed PTX of the test-only kernels (feature `test-kernels`: the
/// emulator cross-check's probe, the benchmark's ceiling), which the tests
/// crate embeds and users' builds do not.
const COMMITTED_TEST_PTX: &str = "tests/test-kernels.ptx";
/// Committed PTX of the sm_90a primitive probe (feature
/// `test-kernels-sm90a`), built for sm_90a: wgmma, TMA and `setmaxnreg`
/// exist only there (the `a` features are not forward compatible, so this
/// module loads on compute capability 9.0 only).
const COMMITTED_TEST_SM90A_PTX: &str = "tests/test-kernels-sm90a.ptx";
/// Committed PTX of the sm_90a attention kernels (feature
/// `attention-sm90a`), which `host` embeds beside `host/kernels.ptx` and
/// loads on compute capability 9.0.
const COMMITTED_SM90A_PTX: &str = "host/kernels-sm90a.ptx";
/// Committed PTX of the backward kernels (feature `attention-backward`),
/// which `host` embeds beside `host/kernels.ptx`.
const COMMITTED_BACKWARD_PTX: &str = "host/kernels-backward.ptx";

/// A PTX module built from `kernels/`: the cargo features it is built with,
/// its target architecture and the ones ptxas checks it for, its own target
/// folder (so that the builds do not overwrite each other's output), where
/// it is committed, and the launch bounds its entries declare.
struct PtxModule {
    features: &'static [&'static str],
    arch: &'static str,
    ptxas_arches: &'static [&'static str],
    target_dir: &'static str,
    committed: &'static str,
    /// `.maxntid threads, 1, 1` on the entry of each kernel named, and
    /// `.minnctapersm min_blocks` where given ([`with_maxntid`]).
    /// Rust has no way to declare launch bounds, and ptxas needs them for
    /// `setmaxnreg` (they fix the registers allocated at launch, the pool
    /// `setmaxnreg` moves between warpgroups: 64K / threads).
    maxntid: fn() -> Vec<LaunchBounds>,
}

const PTX_MODULES: [PtxModule; 5] = [
    PtxModule {
        features: &[],
        arch: PTX_ARCH,
        ptxas_arches: PTXAS_ARCHES,
        target_dir: "target/ptx",
        committed: COMMITTED_PTX,
        maxntid: Vec::new,
    },
    PtxModule {
        features: &["--no-default-features", "--features", "test-kernels"],
        arch: PTX_ARCH,
        ptxas_arches: PTXAS_ARCHES,
        target_dir: "target/ptx-test-kernels",
        committed: COMMITTED_TEST_PTX,
        maxntid: Vec::new,
    },
    PtxModule {
        features: &["--no-default-features", "--features", "test-kernels-sm90a"],
        arch: "sm_90a",
        ptxas_arches: &["sm_90a"],
        target_dir: "target/ptx-test-kernels-sm90a",
        committed: COMMITTED_TEST_SM90A_PTX,
        maxntid: || vec![("probe_sm90", 384, None)],
    },
    PtxModule {
        features: &["--no-default-features", "--features", "attention-sm90a"],
        arch: "sm_90a",
        ptxas_arches: &["sm_90a"],
        target_dir: "target/ptx-sm90a",
        committed: COMMITTED_SM90A_PTX,
        maxntid: || {
            let forward = HOPPER_KERNELS.iter().map(|k| (k.name, k.config.threads(), None));
            forward.chain(HOPPER_BACKWARD_KERNELS.iter().map(|k| (k.name, k.config.threads(), Some(1)))).collect()
        },
    },
    PtxModule {
        features: &["--no-default-features", "--features", "attention-backward"],
        arch: PTX_ARCH,
        ptxas_arches: PTXAS_ARCHES,
        target_dir: "target/ptx-backward",
        committed: COMMITTED_BACKWARD_PTX,
        maxntid: Vec::new,
    },
];

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => {
            let check = args.iter().any(|a| a == "--check");
            let require_ptxas = args.iter().any(|a| a == "--require-ptxas");
            build_ptx(check, require_ptxas)
        }
        Some("gpu-bundle") => gpu_bundle(),
        Some("check-divergence") => {
            let path = args.get(1).map(PathBuf::from).unwrap_or_else(|| workspace_root().join(COMMITTED_PTX));
            fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|ptx| check_divergence(&ptx))
        }
        _ => Err("usage: cargo xtask build-ptx [--check] [--require-ptxas] | cargo xtask gpu-bundle | \
                  cargo xtask check-divergence [PTX]"
            .into()),
    };
    if let Err(message) = result {
        eprintln!("xtask: error: {message}");
        exit(1);
    }
}

type Result<T> = std::result::Result<T, String>;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// Compiles `kernels/` to the PTX of `module` and returns its text.
/// `(kernel, threads, min_blocks)`: the launch bounds of one kernel.
type LaunchBounds = (&'static str, u32, Option<u32>);

fn compile_kernels(root: &Path, module: &PtxModule) -> Result<String> {
    let target_dir = root.join(module.target_dir);
    // The LLVM unroll threshold is raised so that every loop over fragments
    // unrolls: a loop left rolled indexes the accumulator arrays at run time
    // and sends them to local memory (ptxas then reports a stack frame).
    // sm_90a modules declare PTX ISA 8.1 (LLVM's default for the target is
    // 8.0): `red.global.add.v2.f32` of the sm_90a backward needs it.
    let ptx_isa = if module.arch == "sm_90a" { "\"-Ctarget-feature=+ptx81\"," } else { "" };
    let rustflags = format!(
        "target.{PTX_TARGET}.rustflags=[\"-Ctarget-cpu={}\",{ptx_isa}\"-Cllvm-args=-unroll-threshold=1000\"]",
        module.arch
    );
    run(Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root.join("kernels"))
        .args(["build", "--profile", "ptx", "--target", PTX_TARGET, "-Zbuild-std=core", "--config", &rustflags])
        .args(module.features)
        .arg("--target-dir")
        .arg(&target_dir))?;
    let ptx_path = target_dir.join(PTX_TARGET).join("ptx/flash_attn_kernels.ptx");
    let ptx = fs::read_to_string(&ptx_path).map_err(|e| format!("cannot read {}: {e}", ptx_path.display()))?;
    let ptx = without_symbol_comments(&ptx);
    (module.maxntid)()
        .into_iter()
        .try_fold(ptx, |ptx, (kernel, threads, min_blocks)| with_maxntid(&ptx, kernel, threads, min_blocks))
}

/// `ptx` without the comments LLVM puts after some block labels naming the
/// inlined function they came from (`// %_RNC...`): a Rust symbol, whose
/// crate hash depends on the checkout's path, so that the same source
/// compiled in another clone would not match the committed PTX.
fn without_symbol_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        match line.find("// %_R") {
            Some(at) => {
                out.push_str(line[..at].trim_end());
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `ptx` with `.maxntid threads, 1, 1`, and `.minnctapersm min_blocks`
/// where given, between the parameter list and the body (where the PTX ISA
/// puts performance-tuning directives) of kernel `kernel`, which must be
/// there: CUDA's `__launch_bounds__`. `setmaxnreg` needs the registers a
/// thread has at entry fixed (64K / threads); with `.maxntid` alone ptxas
/// may give a kernel fewer, and for the backward's d = 64 kernels it did
/// and ignored their `setmaxnreg` (C7508). `.minnctapersm 1` fixes them
/// (the forward kernels keep `.maxntid` alone: with both, ptxas spilled
/// two of them).
fn with_maxntid(ptx: &str, kernel: &str, threads: u32, min_blocks: Option<u32>) -> Result<String> {
    let start = ptx.find(&format!(".entry {kernel}(")).ok_or_else(|| format!("no kernel {kernel} in the PTX"))?;
    let body = ptx[start..].find("\n{").ok_or_else(|| format!("kernel {kernel} has no body"))? + start;
    let min_blocks = min_blocks.map(|n| format!("\n.minnctapersm {n}")).unwrap_or_default();
    Ok(format!("{}\n.maxntid {threads}, 1, 1{min_blocks}{}", &ptx[..body], &ptx[body..]))
}

fn build_ptx(check: bool, require_ptxas: bool) -> Result<()> {
    let root = workspace_root();
    for module in &PTX_MODULES {
        let ptx = compile_kernels(&root, module)?;
        let committed_path = root.join(module.committed);
        let name = module.committed;
        if check {
            let committed = fs::read_to_string(&committed_path).unwrap_or_default();
            if committed != ptx {
                return Err(format!(
                    "{name} is stale: it differs from what kernels/ compiles to; run `cargo xtask build-ptx` and commit it"
                ));
            }
            println!("xtask: {name} is fresh ({} bytes)", ptx.len());
        } else {
            fs::write(&committed_path, &ptx).map_err(|e| format!("cannot write {}: {e}", committed_path.display()))?;
            println!("xtask: wrote {name} ({} bytes)", ptx.len());
        }
        check_divergence(&ptx)?;
        check_resources(&root, &committed_path, module, require_ptxas)?;
    }
    Ok(())
}

/// Fails if any barrier or warp collective of the PTX is reached under
/// control flow that differs between the threads that must meet there
/// ([`divergence`]).
fn check_divergence(ptx: &str) -> Result<()> {
    let (kernels, violations) = divergence::check(ptx);
    if kernels == 0 {
        return Err("divergence check: no kernel found in the PTX".into());
    }
    if violations.is_empty() {
        println!(
            "xtask: divergence: every barrier and warp collective of the {kernels} kernels is under uniform control"
        );
        return Ok(());
    }
    let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
    Err(format!(
        "{} barrier/collective instructions under divergent control:\n  {}",
        violations.len(),
        listed.join("\n  ")
    ))
}

fn find_ptxas(root: &Path) -> Option<PathBuf> {
    if let Ok(p) = env::var("PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = root.join(".tools/venv/lib");
    let in_venv = fs::read_dir(&venv).ok().and_then(|entries| {
        entries
            .flatten()
            .map(|python| python.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
            .find(|p| p.is_file())
    });
    in_venv.or_else(|| {
        env::var_os("PATH").and_then(|paths| env::split_paths(&paths).map(|d| d.join("ptxas")).find(|p| p.is_file()))
    })
}

/// One function's entry in the ptxas report.
#[derive(Default, Debug)]
struct Resources {
    name: String,
    /// A kernel (`.entry`), not a device function (`.func`) it calls.
    entry: bool,
    registers: u32,
    stack_frame: u32,
    spill_stores: u32,
    spill_loads: u32,
    /// Stack of the kernel and everything it calls.
    cumulative_stack: u32,
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let end = line.find(unit)?;
    line[..end].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v`. A function's stack and spill line follows its
/// "Function properties for NAME" line, which for a device function comes
/// after the kernel's "Used ... registers" line: lines are attributed by
/// name, never to "the last kernel seen".
fn parse_ptxas_report(report: &str) -> Vec<Resources> {
    let mut functions: Vec<Resources> = Vec::new();
    let mut properties_of: Option<usize> = None;
    let index_of = |functions: &mut Vec<Resources>, name: &str, entry: bool| -> usize {
        match functions.iter().position(|f| f.name == name) {
            Some(i) => {
                functions[i].entry |= entry;
                i
            }
            None => {
                functions.push(Resources { name: name.into(), entry, ..Default::default() });
                functions.len() - 1
            }
        }
    };
    let mut current_entry: Option<usize> = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("");
            current_entry = Some(index_of(&mut functions, name, true));
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties_of = Some(index_of(&mut functions, rest.trim(), false));
        } else if line.contains("bytes stack frame") {
            if let Some(f) = properties_of.map(|i| &mut functions[i]) {
                f.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                f.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                f.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used") && line.contains("registers") {
            if let Some(f) = current_entry.map(|i| &mut functions[i]) {
                f.registers = number_before(line, "registers").unwrap_or(0);
                f.cumulative_stack = number_before(line, "bytes cumulative stack size").unwrap_or(0);
            }
            current_entry = None;
        }
    }
    functions
}

fn check_resources(root: &Path, ptx: &Path, module: &PtxModule, require_ptxas: bool) -> Result<()> {
    let Some(ptxas) = find_ptxas(root) else {
        if require_ptxas {
            return Err("ptxas not found (set PTXAS or run scripts/setup.sh)".into());
        }
        println!("xtask: ptxas not found: resource check NOT run (set PTXAS or run scripts/setup.sh)");
        return Ok(());
    };
    let mut failures = Vec::new();
    for &arch in module.ptxas_arches {
        let out_file = root.join(module.target_dir).join(format!("kernels.{arch}.cubin"));
        let output = Command::new(&ptxas)
            .args(["-v", &format!("-arch={arch}"), "-o"])
            .arg(&out_file)
            .arg(ptx)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
        let report = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!("ptxas -arch={arch} failed:\n{report}"));
        }
        let functions = parse_ptxas_report(&report);
        if !functions.iter().any(|f| f.entry) {
            return Err(format!("ptxas -arch={arch} reported no kernels:\n{report}"));
        }
        println!("ptxas {arch}: {:<28} {:>5} {:>6} {:>8} {:>8}", "kernel", "regs", "stack", "spill-st", "spill-ld");
        for k in functions.iter().filter(|f| f.entry) {
            println!(
                "ptxas {arch}: {:<28} {:>5} {:>6} {:>8} {:>8}",
                k.name, k.registers, k.cumulative_stack, k.spill_stores, k.spill_loads
            );
            let local = k.stack_frame + k.cumulative_stack + k.spill_stores + k.spill_loads;
            if (k.name.starts_with("flash_fwd") || k.name.starts_with("flash_bwd")) && local > 0 {
                failures.push(format!(
                    "{arch} {}: stack frame {} B (cumulative {} B), spills {}/{} B",
                    k.name, k.stack_frame, k.cumulative_stack, k.spill_stores, k.spill_loads
                ));
            }
        }
        // ptxas serializes `wgmma`s whose registers ordinary code touches
        // while they are in flight (C7513 and friends), and ignores
        // `setmaxnreg` without launch bounds (C7508): an attention kernel
        // with either would run, slowly. The sm_90a probe's are known and
        // harmless there.
        for line in report.lines().filter(|l| l.contains("Potential Performance Loss")) {
            if line.contains("'flash_") || !line.contains("function '") {
                failures.push(format!("{arch}: {}", line.trim()));
            }
        }
        // Every helper must be inlined into the kernels: a call passes its
        // arguments and results through local memory.
        for f in functions.iter().filter(|f| !f.entry) {
            failures.push(format!("{arch}: device function {} was not inlined", f.name));
        }
    }
    if failures.is_empty() {
        println!(
            "xtask: ptxas ({}): no spills, no stack frame and no device-function call in any attention kernel",
            ptx.display()
        );
        Ok(())
    } else {
        Err(format!("attention kernels use local memory or serialized wgmma:\n  {}", failures.join("\n  ")))
    }
}

/// Builds the GPU test and benchmark executables (release) into
/// `gpu-bundle/` with `scripts/gpu-check.sh`, ready to carry to a GPU machine
/// that has no Rust.
fn gpu_bundle() -> Result<()> {
    let root = workspace_root();
    let bundle = root.join("gpu-bundle");
    let _ = fs::remove_dir_all(&bundle);
    fs::create_dir_all(bundle.join("bin")).map_err(|e| e.to_string())?;
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(&root)
        .args(["test", "--release", "--no-run", "--message-format=json", "-p", "flash-attn-tests", "-p", "flash-attn"])
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!("building tests failed:\n{}", String::from_utf8_lossy(&output.stderr)));
    }
    let mut copied = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (message["executable"].as_str(), message["target"]["name"].as_str()) else {
            continue;
        };
        // Only test harnesses: `cargo test` also builds examples, which are
        // not tests.
        if message["profile"]["test"] != serde_json::Value::Bool(true) {
            continue;
        }
        // The kernels on the CPU emulator (a minute of CPU and more):
        // nothing for the GPU run or its four sanitizer passes to cover;
        // scripts/test.sh runs them. (The emulator cross-checks do use the
        // GPU.)
        if matches!(name, "emulator_attention" | "emulator_hopper" | "emulator_backward") {
            continue;
        }
        let kind = message["target"]["kind"][0].as_str().unwrap_or("");
        let dest = bundle
            .join("bin")
            .join(format!("test-{}-{kind}-{name}", message["package_id"].as_str().map(package_name).unwrap_or("x")));
        fs::copy(exe, &dest).map_err(|e| format!("copy {exe}: {e}"))?;
        copied.push(dest);
    }
    let build = |package: &str, target_kind: &str, name: &str| {
        run(Command::new(&cargo).current_dir(&root).args(["build", "--release", "-p", package, target_kind, name]))
    };
    build("flash-attn-tests", "--bin", "bench")?;
    fs::copy(root.join("target/release/bench"), bundle.join("bin/bench")).map_err(|e| e.to_string())?;
    for example in ["demo", "train"] {
        build("flash-attn", "--example", example)?;
        let built = root.join("target/release/examples").join(example);
        fs::copy(built, bundle.join("bin").join(example)).map_err(|e| e.to_string())?;
    }
    for script in ["gpu-check.sh", "bench_torch.py", "peer_one.py", "ncu-compare.sh"] {
        fs::copy(root.join("scripts").join(script), bundle.join(script)).map_err(|e| format!("{script}: {e}"))?;
    }
    // Every executable embeds the PTX (megabytes of text): compressed, the
    // bundle stays well inside what the GPU machine's carry takes (64 MiB
    // a call with the working tree). xz, not gzip: the executables share
    // most of their bytes, which gzip's 32 KiB window cannot see (47 MB
    // gzipped against 16 MB).
    run(Command::new("tar").current_dir(&bundle).env("XZ_OPT", "-6 -T0").args(["cJf", "bin.tar.xz", "bin"]))?;
    fs::remove_dir_all(bundle.join("bin")).map_err(|e| e.to_string())?;
    println!(
        "xtask: gpu-bundle/ holds {} test executables, bench, demo and train in bin.tar.xz, gpu-check.sh and \
         ncu-compare.sh",
        copied.len()
    );
    println!("xtask: on the GPU machine run: bash gpu-bundle/gpu-check.sh");
    Ok(())
}

/// `path+file:///.../host#flash-attn@0.1.0` -> `flash-attn`.
fn package_name(id: &str) -> &str {
    let tail = id.rsplit('#').next().unwrap_or(id);
    tail.split('@').next().unwrap_or(tail)
}

#[cfg(test)]
mod tests {
    #[test]
    fn symbol_comments_are_dropped_and_nothing_else() {
        let ptx =
            "$L__BB0_58:                             // %_RNCINvNtCsjCE4_18flash.exit\n\tbar.sync 0;\n// %bb.0:\n";
        assert_eq!(without_symbol_comments(ptx), "$L__BB0_58:\n\tbar.sync 0;\n// %bb.0:\n");
        assert_eq!(without_symbol_comments("no comment"), "no comment");
    }

    use super::*;

    /// Abridged from a real report: a kernel that calls a closure LLVM did
    /// not inline. The callee's "0 bytes stack frame" line comes after the
    /// kernel's, and must not hide the kernel's 528 bytes.
    const REPORT: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flash_fwd_d64_f16_full' for 'sm_90'
ptxas info    : Function properties for flash_fwd_d64_f16_full
    528 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 252 registers, used 1 barriers, 528 bytes cumulative stack size
ptxas info    : Compile time = 380.411 ms
ptxas info    : Function properties for _RNCINvNtCs9OWQ2JdyL9p_closure
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'flash_fwd_d128_f16_full' for 'sm_90'
ptxas info    : Function properties for flash_fwd_d128_f16_full
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16 bytes cumulative stack size
";

    #[test]
    fn attributes_each_line_of_a_ptxas_report_to_its_function() {
        let functions = parse_ptxas_report(REPORT);
        assert_eq!(functions.len(), 3);
        let d64 = &functions[0];
        assert!(d64.entry);
        assert_eq!(d64.name, "flash_fwd_d64_f16_full");
        assert_eq!((d64.registers, d64.stack_frame, d64.cumulative_stack), (252, 528, 528));
        let callee = &functions[1];
        assert!(!callee.entry);
        assert_eq!(callee.name, "_RNCINvNtCs9OWQ2JdyL9p_closure");
        let d128 = &functions[2];
        assert_eq!((d128.registers, d128.stack_frame, d128.spill_stores, d128.spill_loads), (255, 16, 8, 4));
    }

    #[test]
    fn puts_launch_bounds_between_a_kernels_parameters_and_its_body() {
        let ptx = ".visible .entry other(\n\t.param .u64 a\n)\n{\n\tret;\n}\n\
                   .visible .entry probe_sm90_other(\n\t.param .u64 a\n)\n{\n\tret;\n}\n\
                   .visible .entry probe_sm90(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";
        let bounded = with_maxntid(ptx, "probe_sm90", 384, None).unwrap();
        assert!(bounded.contains("probe_sm90(\n\t.param .u64 a\n)\n.maxntid 384, 1, 1\n{"), "{bounded}");
        assert_eq!(bounded.matches(".maxntid").count(), 1);
        let bounded = with_maxntid(ptx, "other", 256, Some(1)).unwrap();
        assert!(bounded.contains("other(\n\t.param .u64 a\n)\n.maxntid 256, 1, 1\n.minnctapersm 1\n{"), "{bounded}");
        assert!(with_maxntid(ptx, "missing", 384, None).is_err());
    }

    #[test]
    fn names_packages_from_cargo_ids() {
        assert_eq!(package_name("path+file:///w/host#flash-attn@0.1.0"), "flash-attn");
        assert_eq!(package_name("path+file:///w/tests#0.1.0"), "0.1.0");
    }
}
