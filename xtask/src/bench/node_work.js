// The Node.js fixture of `cargo xtask bench node`: a fixed amount of
// work, where tests/fixtures/hot.js runs for a fixed time. `node
// node_work.js ROUNDS` warms up (every function compiled by TurboFan),
// prints "ready", waits for a line on stdin, then runs ROUNDS rounds of
// main -> hot or warm (ten calls a round, seven of them hot) and prints
// "done CPU_NS NS": the process's CPU time over the rounds (every
// thread's, user and system: the time the kernel spends in a profiler's
// BPF programs while the fixture runs is counted in it, as this kernel
// does not account interrupts apart), then their wall-clock time, which
// counts what a profiler takes from the thread, its own CPU too where it
// competes for the CPU, and also whatever else competes. Then it waits for stdin to close before it exits, so that a
// profiler stopped after the work still finds the process (and its
// JavaScript functions) to name its samples by.

'use strict';

// TurboFan would otherwise inline hot and warm into main, and their
// samples would carry main's frame alone.
require('v8').setFlagsFromString('--no-turbo-inlining');

// The main thread's name (prctl PR_SET_NAME through libuv), which its
// samples carry from here on: the benchmark tells the work's samples
// from those of node's other threads (all named `node`) by it.
process.title = 'nodework';

const fs = require('fs');

// Iterations of a call's loop: about 0.1 ms.
const ITERATIONS = 100000;

function hot(rounds, x) {
  for (let i = 0; i < rounds; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
  }
  return x;
}

function warm(rounds, x) {
  for (let i = 0; i < rounds; i++) {
    x = (Math.imul(x, 1103515245) + 12345) | 0;
    x ^= x >>> 16;
  }
  return x;
}

function main(rounds, x) {
  for (let r = 0; r < rounds; r++) {
    for (let j = 0; j < 10; j++) {
      x = j < 7 ? hot(ITERATIONS, x) : warm(ITERATIONS, x);
    }
  }
  return x;
}

// With NODE_WORK_DEPTH=N, main runs N calls deep (a recursion as a
// framework's or a parser's stack is deep): what a deep walk costs.
const DEPTH = Number(process.env.NODE_WORK_DEPTH || 0);

function deep(n, rounds, x) {
  if (n === 0) {
    return main(rounds, x);
  }
  // Not a tail call V8 could drop, and kept in its own frame: inlining
  // is off.
  return deep(n - 1, rounds, x) | 0;
}

// Blocks until stdin has a line (or is closed); false once it is closed.
// Synchronous, so that the work runs from the script's top level and not
// from a callback of the event loop.
function line() {
  const buf = Buffer.alloc(64);
  for (;;) {
    const n = fs.readSync(0, buf, 0, buf.length, null);
    if (n === 0) {
      return false;
    }
    if (buf.subarray(0, n).includes(10)) {
      return true;
    }
  }
}

const rounds = Number(process.argv[2]);
if (!(rounds >= 0)) {
  throw new Error(`not a number of rounds: ${process.argv[2]}`);
}
// Warm up: enough calls for TurboFan to compile all three.
// Without a depth, main is called from the top, as before there was one.
let x = DEPTH > 0 ? deep(DEPTH, 200, 2463534242) : main(200, 2463534242);
console.log('ready');
line();
const cpu = process.cpuUsage();
const start = process.hrtime.bigint();
x = DEPTH > 0 ? deep(DEPTH, rounds, x) : main(rounds, x);
const wall = process.hrtime.bigint() - start;
const used = process.cpuUsage(cpu);
console.log(`done ${(used.user + used.system) * 1000} ${wall}`);
while (line()) {}
// The result keeps the loops from being optimised away.
process.exitCode = x === 42 ? 1 : 0;
