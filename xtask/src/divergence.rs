//! A static check of the compiled PTX: every barrier and warp-collective
//! instruction is reached under control flow that is uniform where the PTX
//! ISA requires it.
//!
//! `bar.sync 0` (an aligned CTA barrier) must be executed by every thread of
//! the block at the same instruction; `mma.sync.aligned`,
//! `ldmatrix.sync.aligned`, `shfl.sync`, `vote.sync` and `bar.warp.sync`
//! with a full mask by all 32 lanes of a warp. The kernels' source can
//! satisfy that and the compiled PTX still break it: LLVM treats inline
//! `asm!` as ordinary code and may duplicate a barrier into both arms of a
//! branch (tail duplication), after which warps that took different arms
//! meet the "same" barrier at two instructions. The CPU emulator runs the
//! source and cannot see that, so this check reads the PTX itself.
//!
//! It is a divergence analysis in the manner of LLVM's: each register gets
//! a class, uniform across the block, uniform within each warp, or varying
//! per thread, from what its definitions read (`%tid.x` varies; `%tid.x >>
//! 5` is the warp index, uniform per warp; kernel parameters and block ids
//! are uniform), joined with the class of the branches that control the
//! block it is defined in. A conditional branch on a non-uniform predicate
//! makes every block it controls (reachable from it before its immediate
//! post-dominator) divergent at that class. Then block barriers must sit in
//! blocks of uniform control, warp collectives in blocks of at most
//! warp-uniform control.

use std::collections::{HashMap, HashSet};

/// How much a value or a block's control may differ between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// The same in every thread of the block.
    Block,
    /// The same in every lane of a warp.
    Warp,
    /// May differ from lane to lane.
    Thread,
}

/// A register's abstract value: its class, or exactly `%tid.x << shift`,
/// which the warp index and warp-aligned tests are derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Of(Class),
    ThreadIndex { shift: u32 },
}

impl Value {
    fn class(self) -> Class {
        match self {
            Value::Of(c) => c,
            Value::ThreadIndex { .. } => Class::Thread,
        }
    }

    /// The least value above both (the join of the lattice).
    fn join(self, other: Value) -> Value {
        if self == other {
            self
        } else {
            Value::Of(self.class().max(other.class()))
        }
    }
}

/// One PTX instruction of a kernel body.
#[derive(Debug)]
struct Instruction {
    line: usize,
    guard: Option<String>,
    opcode: String,
    operands: Vec<String>,
}

#[derive(Debug, Default)]
struct BasicBlock {
    instructions: Vec<Instruction>,
    successors: Vec<usize>,
}

/// A place where the PTX breaks the rule, for the report.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    pub kernel: String,
    /// 1-based line in the PTX file.
    pub line: usize,
    pub instruction: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: `{}` {}", self.kernel, self.line, self.instruction, self.message)
    }
}

/// Checks every `.entry` of `ptx`; returns the kernels checked and the violations.
pub fn check(ptx: &str) -> (usize, Vec<Violation>) {
    let mut kernels = 0;
    let mut violations = Vec::new();
    for (name, body_start, body) in entries(ptx) {
        kernels += 1;
        violations.extend(check_kernel(&name, body_start, &body));
    }
    (kernels, violations)
}

/// Each `.entry`'s name, the line its body starts at, and the body's lines.
fn entries(ptx: &str) -> Vec<(String, usize, Vec<&str>)> {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(rest) = lines[i].split(".entry ").nth(1) else {
            i += 1;
            continue;
        };
        let name = rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or("").to_string();
        // The body opens with a line of `{` alone, after the parameter list.
        while i < lines.len() && lines[i].trim() != "{" {
            i += 1;
        }
        let start = i + 1;
        let mut depth = 0i32;
        let mut end = start;
        for (j, line) in lines.iter().enumerate().skip(i) {
            let code = line.split("//").next().unwrap_or("");
            depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
            if depth == 0 {
                end = j;
                break;
            }
        }
        out.push((name, start, lines[start..end].to_vec()));
        i = end + 1;
    }
    out
}

/// Splits `text` at commas that are not inside braces or brackets.
fn split_operands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// The statements of a body: labels (as `Err(name)`) and instructions.
fn statements(body_start: usize, body: &[&str]) -> Vec<std::result::Result<Instruction, String>> {
    let mut out = Vec::new();
    for (k, raw) in body.iter().enumerate() {
        let line = body_start + k + 1;
        let mut code = raw.split("//").next().unwrap_or("").trim();
        // A line may hold a scope `{ .reg .b32 tmp; mov.b64 {tmp, %r1}, %rd2; }`.
        while let Some(rest) = code.strip_prefix('{').or_else(|| code.strip_prefix('}')) {
            code = rest.trim_start();
        }
        for stmt in code.split(';') {
            let mut stmt = stmt.trim();
            while let Some(rest) = stmt.strip_prefix('{').or_else(|| stmt.strip_prefix('}')) {
                stmt = rest.trim();
            }
            while let Some(rest) = stmt.strip_suffix('}') {
                stmt = rest.trim();
            }
            if stmt.is_empty() || stmt.starts_with('.') {
                continue;
            }
            if let Some(label) = stmt.strip_suffix(':') {
                if !label.contains(char::is_whitespace) {
                    out.push(Err(label.to_string()));
                    continue;
                }
            }
            let (guard, rest) = match stmt.strip_prefix('@') {
                Some(g) => {
                    let (guard, rest) = g.split_once(char::is_whitespace).unwrap_or((g, ""));
                    (Some(guard.trim_start_matches('!').to_string()), rest.trim())
                }
                None => (None, stmt),
            };
            let (opcode, operands) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            out.push(Ok(Instruction { line, guard, opcode: opcode.to_string(), operands: split_operands(operands) }));
        }
    }
    out
}

fn ends_block(opcode: &str) -> bool {
    opcode == "bra" || opcode.starts_with("bra.") || opcode == "ret" || opcode == "exit" || opcode == "trap"
}

/// The basic blocks and their successors; block `blocks.len()` is the
/// virtual exit that every `ret`/`exit`/`trap` leads to.
fn basic_blocks(stmts: Vec<std::result::Result<Instruction, String>>) -> Vec<BasicBlock> {
    let mut blocks: Vec<BasicBlock> = vec![BasicBlock::default()];
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut pending_targets: Vec<(usize, String)> = Vec::new();
    // Whether the current block can fall through into the next.
    let mut falls_through = vec![true];
    for stmt in stmts {
        match stmt {
            Err(label) => {
                let current = blocks.len() - 1;
                if blocks[current].instructions.is_empty() && !labels.values().any(|&b| b == current) {
                    labels.insert(label, current);
                } else {
                    blocks.push(BasicBlock::default());
                    falls_through.push(true);
                    labels.insert(label, blocks.len() - 1);
                }
            }
            Ok(inst) => {
                let current = blocks.len() - 1;
                let terminator = ends_block(&inst.opcode);
                if terminator {
                    if inst.opcode.starts_with("bra") {
                        if let Some(target) = inst.operands.first() {
                            pending_targets.push((current, target.clone()));
                        }
                    }
                    falls_through[current] = inst.guard.is_some();
                    if !inst.opcode.starts_with("bra") {
                        pending_targets.push((current, String::new())); // to the exit
                    }
                }
                blocks[current].instructions.push(inst);
                if terminator {
                    blocks.push(BasicBlock::default());
                    falls_through.push(true);
                }
            }
        }
    }
    let exit = blocks.len();
    for (i, falls) in falls_through.iter().enumerate() {
        if *falls {
            let next = if i + 1 < exit { i + 1 } else { exit };
            blocks[i].successors.push(next);
        }
    }
    for (from, target) in pending_targets {
        let to = if target.is_empty() { exit } else { labels.get(&target).copied().unwrap_or(exit) };
        if !blocks[from].successors.contains(&to) {
            blocks[from].successors.push(to);
        }
    }
    blocks
}

/// Immediate post-dominator of each block (the virtual exit for blocks
/// whose every path leaves the kernel), by iterating the post-dominator
/// sets to their fixpoint.
fn immediate_post_dominators(blocks: &[BasicBlock]) -> Vec<usize> {
    let n = blocks.len();
    let exit = n;
    let all: HashSet<usize> = (0..=n).collect();
    let mut pdom: Vec<HashSet<usize>> = (0..n).map(|_| all.clone()).collect();
    pdom.push(HashSet::from([exit]));
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..n).rev() {
            let mut set: Option<HashSet<usize>> = None;
            for &s in &blocks[b].successors {
                set = Some(match set {
                    None => pdom[s].clone(),
                    Some(acc) => acc.intersection(&pdom[s]).copied().collect(),
                });
            }
            let mut set = set.unwrap_or_else(|| HashSet::from([exit]));
            set.insert(b);
            if set != pdom[b] {
                pdom[b] = set;
                changed = true;
            }
        }
    }
    // The immediate one is the strict post-dominator that every other
    // strict post-dominator also post-dominates: the one with the largest set.
    (0..n).map(|b| pdom[b].iter().copied().filter(|&p| p != b).max_by_key(|&p| pdom[p].len()).unwrap_or(exit)).collect()
}

/// Blocks reachable from `from`'s successors without passing `stop`.
fn controlled_region(blocks: &[BasicBlock], from: usize, stop: usize) -> Vec<usize> {
    let mut seen = HashSet::new();
    let mut stack: Vec<usize> = blocks[from].successors.clone();
    while let Some(b) = stack.pop() {
        if b == stop || b >= blocks.len() || !seen.insert(b) {
            continue;
        }
        stack.extend(blocks[b].successors.iter().copied());
    }
    let mut region: Vec<usize> = seen.into_iter().collect();
    region.sort_unstable();
    region
}

fn is_register(token: &str) -> bool {
    token.starts_with('%') && !token.contains('.')
}

/// Register names in an operand (`%r1`, `{%r1, %r2}`, `[%rd3+16]`), with
/// the scope temporaries that inline asm declares (`tmp`).
fn registers_in(operand: &str) -> impl Iterator<Item = &str> {
    operand
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '%' || c == '_' || c == '.'))
        .filter(|t| is_register(t) || *t == "tmp")
}

/// The value a special register or other source token contributes.
fn source_value(token: &str) -> Option<Value> {
    match token {
        "%tid.x" => Some(Value::ThreadIndex { shift: 0 }),
        t if t.starts_with("%tid") || t.starts_with("%laneid") || t.starts_with("%lanemask") => {
            Some(Value::Of(Class::Thread))
        }
        t if t.starts_with("%clock") || t.starts_with("%globaltimer") || t.starts_with("%warpid") => {
            Some(Value::Of(Class::Thread))
        }
        _ => None,
    }
}

fn immediate(token: &str) -> Option<u64> {
    let t = token.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if let Some(neg) = t.strip_prefix('-') {
        neg.parse::<i64>().ok().map(|v| (-v) as u64)
    } else {
        t.parse::<u64>().ok()
    }
}

/// Instructions without a destination register.
fn has_destination(opcode: &str) -> bool {
    !(opcode.starts_with("st.")
        || opcode.starts_with("cp.async")
        || opcode.starts_with("bar")
        || opcode.starts_with("bra")
        || opcode.starts_with("red.")
        || opcode.starts_with("prefetch")
        || opcode.starts_with("fence")
        || opcode.starts_with("membar")
        || opcode == "ret"
        || opcode == "exit"
        || opcode == "trap")
}

/// What `inst` writes to its destination, from its sources' values.
fn result_value(inst: &Instruction, sources: &[Value]) -> Value {
    let op = inst.opcode.as_str();
    let joined = sources.iter().fold(Value::Of(Class::Block), |a, &b| a.join(b));
    // Results that differ per lane whatever the inputs, or per warp.
    if op.starts_with("shfl") || op.starts_with("mma") || op.starts_with("ldmatrix") || op.starts_with("atom") {
        return Value::Of(Class::Thread);
    }
    if op.starts_with("vote") {
        return Value::Of(joined.class().max(Class::Warp));
    }
    let first = sources.first().copied();
    let constant = inst.operands.get(2).and_then(|o| immediate(o));
    match (first, constant) {
        (Some(Value::ThreadIndex { shift }), c) if op.starts_with("mov") || op.starts_with("cvt") => {
            let _ = c;
            Value::ThreadIndex { shift }
        }
        (Some(Value::ThreadIndex { shift }), Some(c)) if op.starts_with("shl") => {
            Value::ThreadIndex { shift: shift + c as u32 }
        }
        (Some(Value::ThreadIndex { shift }), Some(c)) if op.starts_with("shr") || op.starts_with("div") => {
            // `tid << shift` over 32 << shift or more lanes of a warp: uniform per warp.
            let divisor_log2 = if op.starts_with("shr") {
                c
            } else if c.is_power_of_two() {
                c.ilog2() as u64
            } else {
                0
            };
            if divisor_log2 >= 5 + shift as u64 {
                Value::Of(Class::Warp)
            } else {
                Value::Of(Class::Thread)
            }
        }
        (Some(Value::ThreadIndex { shift }), Some(mask)) if op.starts_with("and") => {
            if mask & ((1u64 << (5 + shift)) - 1) == 0 {
                Value::Of(Class::Warp)
            } else {
                Value::Of(Class::Thread)
            }
        }
        (Some(Value::ThreadIndex { shift }), Some(pos)) if op.starts_with("bfe") => {
            if pos >= 5 + shift as u64 {
                Value::Of(Class::Warp)
            } else {
                Value::Of(Class::Thread)
            }
        }
        (Some(Value::ThreadIndex { shift }), Some(c)) if op.starts_with("setp") => {
            // Comparing `tid << shift` against a bound on a warp boundary.
            let warp = 32u64 << shift;
            let on_boundary = match op.split('.').nth(1) {
                Some("lt" | "ge" | "lo" | "hs") => c % warp == 0,
                Some("gt" | "le" | "hi" | "ls") => (c + 1) % warp == 0,
                _ => false,
            };
            if on_boundary && sources.len() == 1 {
                Value::Of(Class::Warp)
            } else {
                Value::Of(Class::Thread)
            }
        }
        _ => Value::Of(joined.class()),
    }
}

/// What an instruction needs of its block's control, if anything.
fn requirement(inst: &Instruction) -> Option<(Class, &'static str)> {
    let op = inst.opcode.as_str();
    let block_barrier = (op.starts_with("bar.sync") || op.starts_with("barrier.sync") || op.starts_with("bar.red"))
        || op.starts_with("barrier.cta.sync")
        || op.starts_with("barrier.cta.red");
    if block_barrier && !op.starts_with("bar.warp") {
        // With a thread count it is a named barrier of part of the block,
        // reached by whole warps.
        return Some(if inst.operands.len() > 1 {
            (Class::Warp, "a named barrier must be reached by whole warps")
        } else {
            (Class::Block, "a CTA barrier must be reached by every thread of the block at this instruction")
        });
    }
    if op.starts_with("bar.warp.sync")
        || op.starts_with("mma.sync")
        || op.starts_with("ldmatrix.sync")
        || op.starts_with("shfl.sync")
        || op.starts_with("vote.sync")
        || op.starts_with("wgmma")
        || op.starts_with("stmatrix")
    {
        return Some((Class::Warp, "a warp-collective instruction must be reached by all 32 lanes of the warp"));
    }
    None
}

fn check_kernel(name: &str, body_start: usize, body: &[&str]) -> Vec<Violation> {
    let blocks = basic_blocks(statements(body_start, body));
    let ipdom = immediate_post_dominators(&blocks);
    let mut values: HashMap<String, Value> = HashMap::new();
    // Each block's control class and the branch line that set it.
    let mut control: Vec<(Class, usize)> = vec![(Class::Block, 0); blocks.len()];
    let value_of = |values: &HashMap<String, Value>, token: &str| -> Value {
        source_value(token).or_else(|| values.get(token).copied()).unwrap_or(Value::Of(Class::Block))
    };
    loop {
        let mut changed = false;
        for (b, block) in blocks.iter().enumerate() {
            let block_control = control[b].0;
            for inst in &block.instructions {
                let guard = inst.guard.as_deref().map(|g| value_of(&values, g).class()).unwrap_or(Class::Block);
                // A conditional branch makes the blocks it controls divergent.
                if inst.opcode.starts_with("bra") {
                    let class = guard.max(block_control);
                    if class > Class::Block && inst.guard.is_some() {
                        for r in controlled_region(&blocks, b, ipdom[b]) {
                            if class > control[r].0 {
                                control[r] = (class, inst.line);
                                changed = true;
                            }
                        }
                    }
                    continue;
                }
                if !has_destination(&inst.opcode) || inst.operands.is_empty() {
                    continue;
                }
                let destinations: Vec<&str> = registers_in(&inst.operands[0]).collect();
                let mut sources: Vec<Value> = Vec::new();
                for operand in &inst.operands[1..] {
                    let tokens: Vec<&str> = operand
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '%' || c == '_' || c == '.'))
                        .filter(|t| !t.is_empty())
                        .collect();
                    for t in tokens {
                        if let Some(v) = source_value(t) {
                            sources.push(v);
                        } else if is_register(t) || t == "tmp" {
                            sources.push(value_of(&values, t));
                        }
                    }
                }
                // `setp` writes `%p|%q`; loads take the class of their address.
                let mut value = result_value(inst, &sources);
                let context = Value::Of(guard.max(block_control));
                if context != Value::Of(Class::Block) {
                    value = value.join(context);
                }
                for d in destinations {
                    let new = match values.get(d) {
                        Some(&old) => old.join(value),
                        None => value,
                    };
                    if values.get(d) != Some(&new) {
                        values.insert(d.to_string(), new);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut violations = Vec::new();
    for (b, block) in blocks.iter().enumerate() {
        for inst in &block.instructions {
            let Some((allowed, rule)) = requirement(inst) else { continue };
            let guard = inst.guard.as_deref().map(|g| value_of(&values, g).class()).unwrap_or(Class::Block);
            let (class, branch_line) = control[b];
            if class.max(guard) > allowed {
                let why = if guard > allowed {
                    format!("its guard {} is {:?}-varying", inst.guard.as_deref().unwrap_or(""), guard)
                } else {
                    format!("it is under control that varies per {class:?} (the branch at line {branch_line})")
                };
                violations.push(Violation {
                    kernel: name.to_string(),
                    line: inst.line,
                    instruction: inst.opcode.clone(),
                    message: format!("{why}: {rule}"),
                });
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(body: &str) -> String {
        format!(".visible .entry k(\n\t.param .b64 k_param_0\n)\n{{\n{body}\n}}\n")
    }

    fn violations(body: &str) -> Vec<Violation> {
        let (kernels, v) = check(&kernel(body));
        assert_eq!(kernels, 1);
        v
    }

    /// The decode kernel `flash_fwd_d32_f16_decode` as fd63d20 compiled
    /// it, with its barriers as `asm!`: LLVM duplicated the warp merge's
    /// second barrier into the `warp != 0` and `warp == 0` paths.
    #[test]
    fn the_decode_kernel_with_asm_barriers_is_reported() {
        let ptx = include_str!("../fixtures/decode_d32_f16_asm_barriers.ptx");
        let (kernels, v) = check(ptx);
        assert_eq!(kernels, 1);
        let lines: Vec<usize> = v.iter().map(|v| v.line).collect();
        assert_eq!(lines, vec![580, 1668], "{v:?}");
        assert!(v.iter().all(|v| v.instruction == "bar.sync" && v.message.contains("per Warp")), "{v:?}");
    }

    #[test]
    fn uniform_branches_around_a_barrier_pass() {
        let v = violations(
            "mov.u32 %r1, %ctaid.x;\n\
             setp.eq.b32 %p1, %r1, 0;\n\
             @%p1 bra $L__BB0_2;\n\
             bar.sync 0;\n\
             $L__BB0_2:\n\
             bar.sync 0;\n\
             ret;",
        );
        assert_eq!(v, vec![]);
    }

    #[test]
    fn a_barrier_duplicated_into_warp_dependent_arms_is_reported() {
        // The shape LLVM gave the decode kernels' warp merge: `if warp != 0
        // { store; bar.sync; ret } else { bar.sync; ... }`.
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             shr.u32 %r2, %r1, 5;\n\
             setp.ne.b32 %p1, %r2, 0;\n\
             @%p1 bra $L__BB0_2;\n\
             bar.sync 0;\n\
             st.shared.b32 [%r1], %r2;\n\
             ret;\n\
             $L__BB0_2:\n\
             bar.sync 0;\n\
             ret;",
        );
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|v| v.instruction == "bar.sync" && v.message.contains("Warp")), "{v:?}");
        // But warp collectives may sit under warp-uniform control.
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             shr.u32 %r2, %r1, 5;\n\
             setp.ne.b32 %p1, %r2, 0;\n\
             @%p1 bra $L__BB0_2;\n\
             bar.warp.sync 0xffffffff;\n\
             $L__BB0_2:\n\
             ret;",
        );
        assert_eq!(v, vec![]);
    }

    #[test]
    fn an_early_exit_of_some_threads_before_a_barrier_is_reported() {
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             setp.gt.u32 %p1, %r1, 40;\n\
             @%p1 bra $L__BB0_2;\n\
             bar.sync 0;\n\
             $L__BB0_2:\n\
             ret;",
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("Thread"), "{v:?}");
    }

    #[test]
    fn lane_dependent_control_around_a_warp_collective_is_reported() {
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             and.b32 %r2, %r1, 31;\n\
             setp.eq.b32 %p1, %r2, 0;\n\
             @%p1 bra $L__BB0_2;\n\
             shfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;\n\
             $L__BB0_2:\n\
             ret;",
        );
        assert_eq!(v.len(), 1, "{v:?}");
        // The same test on a warp boundary is uniform per warp.
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             setp.gt.u32 %p1, %r1, 63;\n\
             @%p1 bra $L__BB0_2;\n\
             shfl.sync.bfly.b32 %r3, %r1, 1, 31, -1;\n\
             $L__BB0_2:\n\
             ret;",
        );
        assert_eq!(v, vec![]);
    }

    #[test]
    fn values_defined_under_divergent_control_are_divergent() {
        // %r3 is 1 in some warps and 0 in others; a loop bound on it makes
        // the loop's barrier divergent.
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             shr.u32 %r2, %r1, 5;\n\
             mov.u32 %r3, 0;\n\
             setp.ne.b32 %p1, %r2, 0;\n\
             @%p1 bra $L__BB0_2;\n\
             mov.u32 %r3, 1;\n\
             $L__BB0_2:\n\
             setp.eq.b32 %p2, %r3, 0;\n\
             @%p2 bra $L__BB0_4;\n\
             $L__BB0_3:\n\
             bar.sync 0;\n\
             $L__BB0_4:\n\
             ret;",
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].line, 15);
    }

    #[test]
    fn a_loop_with_a_warp_dependent_trip_count_controls_its_body() {
        let v = violations(
            "mov.u32 %r1, %tid.x;\n\
             shr.u32 %r2, %r1, 5;\n\
             $L__BB0_1:\n\
             mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r4, %r5, %r6, %r7}, {%r8, %r9, %r10, %r11}, {%r12, %r13}, {%r4, %r5, %r6, %r7};\n\
             bar.sync 0;\n\
             add.s32 %r2, %r2, -1;\n\
             setp.ne.b32 %p1, %r2, 0;\n\
             @%p1 bra $L__BB0_1;\n\
             ret;",
        );
        // The barrier in the loop is divergent across warps; the mma is not.
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].instruction, "bar.sync");
    }
}
