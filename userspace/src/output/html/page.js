// rtrace's profile page: a heat map of the run (FlameScope style), a flame
// graph of the whole run or of a range picked on it, and a perf-report-like
// table. Everything is built from the JSON in #rtrace-data; nothing is
// fetched. Rendering is synchronous so that the page is complete (and
// body[data-ready]) as soon as this script has run.
(function () {
  'use strict';

  const $ = (id) => document.getElementById(id);
  const DATA = JSON.parse($('rtrace-data').textContent);

  const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESCAPES[c]);

  // ---------------------------------------------------------------- units

  const UNIT = DATA.unit || 'samples';

  // A number with at most `digits` decimals, and no trailing zeros.
  function trim(x, digits) {
    const s = x.toFixed(digits);
    return s.indexOf('.') < 0 ? s : s.replace(/\.?0+$/, '');
  }

  const NS_PER = { ns: 1, us: 1e3, ms: 1e6, s: 1e9 };
  const TIME_UNIT = NS_PER[UNIT] !== undefined;

  // A count as the reader wants it: samples as they are, times (off-CPU
  // profiles count them) in the unit that suits, bytes in binary
  // multiples.
  function fmtCount(c) {
    if (TIME_UNIT) {
      const ns = c * NS_PER[UNIT];
      if (ns >= 1e9) return trim(ns / 1e9, ns >= 1e11 ? 1 : 3) + ' s';
      if (ns >= 1e6) return trim(ns / 1e6, 2) + ' ms';
      if (ns >= 1e3) return trim(ns / 1e3, 2) + ' µs';
      return trim(ns, 0) + ' ns';
    }
    if (UNIT === 'bytes') {
      const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB'];
      let v = c, i = 0;
      while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
      return i === 0 ? c + ' bytes' : trim(v, 2) + ' ' + units[i];
    }
    // "1 samples" as FlameGraph says it: one shape for every count keeps
    // the tooltips easy to read by scripts.
    return c + ' ' + UNIT;
  }

  // "m of n" with the unit said once where it can be.
  function fmtOf(m, n) {
    if (TIME_UNIT || UNIT === 'bytes') return fmtCount(m) + ' of ' + fmtCount(n);
    return m + ' of ' + n + ' ' + UNIT;
  }

  const pct = (f) => (isFinite(f) ? (f * 100).toFixed(2) : '0.00') + '%';

  // ----------------------------------------------------------- the tables

  const KINDS = DATA.kinds || [];
  const MODULES = DATA.modules || [];
  const FNAME = DATA.frames.name;
  const FKIND = DATA.frames.kind || [];
  const FMOD = DATA.frames.module || [];
  const STACKS = DATA.stacks;
  const NSTACKS = STACKS.length;
  const PROFILES = DATA.profiles || [];
  const DIFF = PROFILES.length >= 2;
  // The profile drawn: the only one, or AFTER on a differential page.
  const MAIN = PROFILES[PROFILES.length - 1] || { name: 'profile', total: 0, stack: [], slot: [], count: [] };
  const BEFORE = DIFF ? PROFILES[0] : null;
  const COMM_KIND = KINDS.indexOf('comm');

  const kindName = (k) => (k >= 0 && k < KINDS.length ? KINDS[k] : 'unknown');
  const moduleName = (m) => (m >= 0 && m < MODULES.length ? MODULES[m] : m === -2 ? '(several modules)' : '[unknown]');
  const baseName = (m) => (m.charAt(0) === '[' || m.charAt(0) === '(' ? m : m.slice(m.lastIndexOf('/') + 1));

  // The building blocks below are functions of their own, each run once:
  // V8 optimizes a hot loop by compiling the function around it, which is
  // quick for a small function and slow for this whole file's.

  // Flame graphs merge frames by what they show, name and kind (as the
  // folded lines' annotated names do), whatever table entries the frames
  // came from.
  function canonicalFrames() {
    const canonOf = new Int32Array(FNAME.length);
    const cName = [], cKind = [];
    const seen = new Map();
    for (let f = 0; f < FNAME.length; f++) {
      const key = FKIND[f] + '\u0001' + FNAME[f];
      let c = seen.get(key);
      if (c === undefined) {
        c = cName.length;
        seen.set(key, c);
        cName.push(String(FNAME[f]));
        cKind.push(FKIND[f] === undefined ? -1 : FKIND[f]);
      }
      canonOf[f] = c;
    }
    return { canonOf, cName, cKind };
  }
  const { canonOf, cName, cKind } = canonicalFrames();
  const NC = cName.length;

  // The flame tree of every stack of every profile, built once; a view (a
  // range, or one side of a diff) only recounts it. Node 0 is "all"; a
  // child always gets a larger id than its parent, so counts propagate
  // to the root in one backward pass.
  function buildTree() {
    let refs = 1;
    for (let s = 0; s < NSTACKS; s++) refs += STACKS[s].length;
    // An open-addressing table of node ids, keyed by (parent, frame) as
    // the nodes themselves record them: some times quicker than a Map.
    let bits = 10;
    while ((1 << bits) < refs * 2) bits++;
    const mask = (1 << bits) - 1;
    const slots = new Int32Array(1 << bits).fill(-1);
    const parent = new Int32Array(refs), frameOf = new Int32Array(refs), depth = new Int32Array(refs);
    // Frames merge by name and kind; a node's module is its own where
    // all of its frames agree (a "_start" is each program's own).
    const moduleOf = new Int32Array(refs);
    parent[0] = -1;
    frameOf[0] = -1;
    moduleOf[0] = -1;
    let count = 1;
    const stackLeaf = new Int32Array(NSTACKS);
    for (let s = 0; s < NSTACKS; s++) {
      const st = STACKS[s];
      let n = 0;
      for (let j = 0; j < st.length; j++) {
        const f = st[j], c = canonOf[f];
        if (c === undefined) continue;
        const fm = FMOD[f] === undefined ? -1 : FMOD[f];
        let h = (Math.imul(n, 0x9e3779b1) ^ Math.imul(c + 1, 0x85ebca77)) & mask;
        let m;
        for (;;) {
          m = slots[h];
          if (m < 0) {
            m = count++;
            parent[m] = n;
            frameOf[m] = c;
            depth[m] = depth[n] + 1;
            moduleOf[m] = fm;
            slots[h] = m;
            break;
          }
          if (parent[m] === n && frameOf[m] === c) {
            if (moduleOf[m] !== fm) moduleOf[m] = -2;
            break;
          }
          h = (h + 1) & mask;
        }
        n = m;
      }
      stackLeaf[s] = n;
    }
    return {
      N: count,
      parent: parent.subarray(0, count),
      frameOf: frameOf.subarray(0, count),
      depth: depth.subarray(0, count),
      moduleOf: moduleOf.subarray(0, count),
      stackLeaf,
    };
  }
  const { N, parent, frameOf, depth, moduleOf, stackLeaf } = buildTree();

  // Children in compressed rows, each row sorted by name as FlameGraph
  // sorts them: nodes bucketed by their frame's rank, then dealt to their
  // parents in that order, which needs no comparisons per node.
  function buildChildren() {
    const childStart = new Int32Array(N + 1);
    const childList = new Int32Array(Math.max(N - 1, 0));
    const order = new Int32Array(NC);
    for (let c = 0; c < NC; c++) order[c] = c;
    order.sort((a, b) => (cName[a] < cName[b] ? -1 : cName[a] > cName[b] ? 1 : cKind[a] - cKind[b]));
    const rank = new Int32Array(NC);
    for (let i = 0; i < NC; i++) rank[order[i]] = i;
    const byRank = new Int32Array(NC + 1);
    for (let n = 1; n < N; n++) byRank[rank[frameOf[n]] + 1]++;
    for (let i = 0; i < NC; i++) byRank[i + 1] += byRank[i];
    const sorted = new Int32Array(Math.max(N - 1, 0));
    for (let n = 1; n < N; n++) sorted[byRank[rank[frameOf[n]]]++] = n;
    for (let n = 1; n < N; n++) childStart[parent[n] + 1]++;
    for (let n = 0; n < N; n++) childStart[n + 1] += childStart[n];
    const fill = childStart.slice(0, N);
    for (let i = 0; i < sorted.length; i++) {
      const n = sorted[i];
      childList[fill[parent[n]]++] = n;
    }
    return { childStart, childList };
  }
  const { childStart, childList } = buildChildren();

  // The report's keys, (command, module, symbol) as perf report's
  // --sort comm,dso,sym: per stack its distinct keys (Children counts a
  // sample once however often a recursive symbol occurs) and its leaf's
  // (Self). Command frames are no symbols.
  function buildKeys() {
    const kComm = [], kModule = [], kName = [], kKind = [];
    const keyStart = new Int32Array(NSTACKS + 1);
    const leafKey = new Int32Array(NSTACKS).fill(-1);
    const symId = new Map();
    const frameSym = new Int32Array(FNAME.length);
    const symModule = [], symName = [], symKind = [];
    for (let f = 0; f < FNAME.length; f++) {
      const m = FMOD[f] === undefined ? -1 : FMOD[f];
      const key = m + '\u0001' + FNAME[f];
      let id = symId.get(key);
      if (id === undefined) {
        id = symName.length;
        symId.set(key, id);
        symModule.push(m);
        symName.push(String(FNAME[f]));
        symKind.push(FKIND[f]);
      }
      frameSym[f] = id;
    }
    const NS = symName.length;
    // Commands numbered densely, so that (command, symbol) pairs index a
    // table where it is small enough, a Map where not.
    const commIndex = new Map();
    const stackComm = new Int32Array(NSTACKS);
    for (let s = 0; s < NSTACKS; s++) {
      const c = STACKS[s].length ? canonOf[STACKS[s][0]] : -1;
      let i = commIndex.get(c);
      if (i === undefined) { i = commIndex.size; commIndex.set(c, i); }
      stackComm[s] = i;
    }
    const commOfIndex = Array.from(commIndex.keys());
    const span = commIndex.size * NS;
    const table = span <= (1 << 22) ? new Int32Array(span).fill(-1) : null;
    const keys = table ? null : new Map();
    let stamp = new Int32Array(1024);
    let list = new Int32Array(1024), used = 0;
    for (let s = 0; s < NSTACKS; s++) {
      const st = STACKS[s];
      const ci = stackComm[s];
      for (let j = 1; j < st.length; j++) {
        const f = st[j];
        if (!(f >= 0 && f < FNAME.length) || FKIND[f] === COMM_KIND) continue;
        const sym = frameSym[f];
        const kk = ci * NS + sym;
        let k = table ? table[kk] : keys.get(kk);
        if (k === undefined || k < 0) {
          k = kName.length;
          if (table) table[kk] = k; else keys.set(kk, k);
          const comm = commOfIndex[ci];
          kComm.push(comm >= 0 ? cName[comm] : '');
          kModule.push(moduleName(symModule[sym]));
          kName.push(symName[sym]);
          kKind.push(symKind[sym]);
          if (k === stamp.length) { const b = new Int32Array(k * 2); b.set(stamp); stamp = b; }
          stamp[k] = -1;
        }
        if (stamp[k] !== s) {
          stamp[k] = s;
          if (used === list.length) { const b = new Int32Array(used * 2); b.set(list); list = b; }
          list[used++] = k;
        }
        if (j === st.length - 1) leafKey[s] = k;
      }
      keyStart[s + 1] = used;
    }
    return { kComm, kModule, kName, kKind, keyStart, leafKey, keyList: list.subarray(0, used) };
  }
  const { kComm, kModule, kName, kKind, keyStart, leafKey, keyList } = buildKeys();
  const NK = kName.length;

  // ---------------------------------------------------------------- views

  // Counts per stack of profile `p`, of the entries in `range` (1-based
  // slots, inclusive) or of all of them. Entries without a time (slot 0)
  // count in the whole run only.
  function stackCounts(p, range) {
    const sc = new Float64Array(NSTACKS);
    const st = p.stack, sl = p.slot, ct = p.count, n = st.length;
    if (!range) {
      for (let i = 0; i < n; i++) sc[st[i]] += ct[i];
    } else {
      const a = range[0], b = range[1];
      for (let i = 0; i < n; i++) {
        const s = sl[i];
        if (s >= a && s <= b) sc[st[i]] += ct[i];
      }
    }
    return sc;
  }

  function nodeCounts(sc) {
    const nc = new Float64Array(N);
    for (let s = 0; s < NSTACKS; s++) if (sc[s] !== 0) nc[stackLeaf[s]] += sc[s];
    for (let n = N - 1; n > 0; n--) if (nc[n] !== 0) nc[parent[n]] += nc[n];
    return nc;
  }

  function keyCounts(sc) {
    const total = new Float64Array(NK), self = new Float64Array(NK);
    for (let s = 0; s < NSTACKS; s++) {
      const c = sc[s];
      if (c === 0) continue;
      for (let j = keyStart[s], e = keyStart[s + 1]; j < e; j++) total[keyList[j]] += c;
      if (leafKey[s] >= 0) self[leafKey[s]] += c;
    }
    return { total, self };
  }

  function makeView(range) {
    const sc = stackCounts(MAIN, range);
    const v = { range, counts: nodeCounts(sc), keys: keyCounts(sc), before: null, keysBefore: null };
    v.total = v.counts[0];
    if (BEFORE) {
      const sb = stackCounts(BEFORE, range);
      v.before = nodeCounts(sb);
      v.keysBefore = keyCounts(sb);
      v.totalBefore = v.before[0];
    }
    return v;
  }

  let view = makeView(null);

  // --------------------------------------------------------------- colours

  // A number in [0, 1) that varies with the name, so that neighbouring
  // frames of one kind stay apart (FlameGraph varies its palettes so).
  function nameHash(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (Math.imul(h, 31) + name.charCodeAt(i)) >>> 0;
    return (h % 1000) / 1000;
  }

  const rgb = (r, g, b) => 'rgb(' + Math.round(r) + ',' + Math.round(g) + ',' + Math.round(b) + ')';

  // FlameGraph's mixed-mode palette (--color=java), with purple for
  // interpreted frames and blue for markers as rtrace's SVGs have them.
  function kindColor(kind, v) {
    switch (kind) {
      case 'kernel': return rgb(190 + 65 * v, 90 + 65 * v, 0);
      case 'native': return rgb(200 + 55 * v, 50 + 80 * v, 50 + 80 * v);
      case 'jit': return rgb(50 + 60 * v, 200 + 55 * v, 50 + 60 * v);
      case 'interpreted': return rgb(150 + 60 * v, 80 + 40 * v, 200 + 55 * v);
      case 'inlined': return rgb(50 + 60 * v, 165 + 55 * v, 165 + 55 * v);
      case 'comm': return rgb(170 + 45 * v, 170 + 45 * v, 175 + 45 * v);
      case 'marker': return rgb(60 + 60 * v, 90 + 70 * v, 200 + 55 * v);
      default: return rgb(175 + 55 * v, 175 + 55 * v, 50 + 20 * v);
    }
  }

  const colorCache = new Array(NC);
  function frameColor(c) {
    let col = colorCache[c];
    if (col === undefined) col = colorCache[c] = kindColor(kindName(cKind[c]), nameHash(cName[c]));
    return col;
  }

  // Differential colour: red where the share grew, blue where it shrank,
  // saturating at 5 points; the square root keeps small changes visible.
  const DIFF_SATURATION = 0.05;
  function diffColor(d) {
    let t = Math.max(-1, Math.min(1, d / DIFF_SATURATION));
    if (Math.abs(t) < 1e-4) return rgb(236, 236, 236);
    const up = t > 0;
    t = Math.sqrt(Math.abs(t));
    const lo = 236 - 190 * t, hi = 236 + 19 * t;
    return up ? rgb(hi, lo, lo) : rgb(lo, lo, hi);
  }

  // ----------------------------------------------------------- the header

  $('title').textContent = DATA.title || 'rtrace profile';
  {
    const dl = $('facts');
    const frag = document.createDocumentFragment();
    for (const pair of DATA.facts || []) {
      const dt = document.createElement('dt');
      dt.textContent = pair[0];
      const dd = document.createElement('dd');
      dd.textContent = pair[1];
      frag.appendChild(dt);
      frag.appendChild(dd);
    }
    dl.appendChild(frag);
    if (!dl.children.length) dl.hidden = true;
  }

  // ------------------------------------------------------------ heat map

  const heat = { slots: 0, rows: 1, slotMs: 20, cells: null, lo: 0, hi: -1 };
  const HEAT_LEFT = 62, HEAT_TOP = 22, HEAT_RIGHT = 22, HEAT_BOTTOM = 6;
  let range = null;

  // White (nothing) through ColorBrewer's reds to the darkest at the
  // maximum, as FlameScope shades its cells.
  const HEAT_STOPS = [[254, 229, 217], [252, 187, 161], [252, 146, 114], [251, 106, 74], [239, 59, 44], [203, 24, 29], [165, 15, 21], [103, 0, 13]];
  function heatColor(c, max) {
    if (!(c > 0)) return '#f7f7f7';
    const t = Math.min(1, c / max) * (HEAT_STOPS.length - 1);
    const i = Math.min(Math.floor(t), HEAT_STOPS.length - 2), f = t - i;
    const a = HEAT_STOPS[i], b = HEAT_STOPS[i + 1];
    return rgb(a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f);
  }

  const slotTime = (i) => (i * heat.slotMs / 1000).toFixed(3);

  function buildHeat() {
    const svg = $('heatmap');
    const none = $('heatmap-none');
    if (DIFF || !DATA.heat) {
      none.textContent = DIFF
        ? 'no heat map on a differential page'
        : 'No heat map: the samples of this profile carry no times.';
      none.hidden = false;
      $('heat-scroll').remove();
      $('heat-legend').textContent = '';
      return;
    }
    const slotMs = Number(DATA.heat.slot_ms) > 0 ? Number(DATA.heat.slot_ms) : 20;
    const rows = Math.max(1, Math.round(1000 / slotMs));
    let slots = Math.max(0, DATA.heat.slots | 0);
    const sl = MAIN.slot, ct = MAIN.count;
    for (let i = 0; i < sl.length; i++) if (sl[i] > slots) slots = sl[i];
    const perSlot = new Float64Array(slots + 1);
    for (let i = 0; i < sl.length; i++) if (sl[i] > 0) perSlot[sl[i]] += ct[i];
    let max = 0;
    for (let s = 1; s <= slots; s++) if (perSlot[s] > max) max = perSlot[s];
    const cols = Math.max(1, Math.ceil(slots / rows));

    const avail = ($('heat-scroll').clientWidth || 1200) - HEAT_LEFT - HEAT_RIGHT;
    const cw = Math.max(12, Math.min(24, Math.floor(avail / cols)));
    const ch = rows <= 60 ? 9 : Math.max(3, Math.floor(500 / rows));
    Object.assign(heat, { slots, rows, slotMs, cw, ch, cols });

    // Second labels: a round step, at most ~30 labels, none overlapping.
    const labelW = String(cols - 1).length * 7 + 6;
    let step = 1;
    for (const s of [1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 18000, 36000]) {
      step = s;
      if (cols / s <= 30 && s * cw >= labelW) break;
    }
    const width = HEAT_LEFT + cols * cw + HEAT_RIGHT;
    const height = HEAT_TOP + rows * ch + HEAT_BOTTOM;
    const out = [];
    out.push('<text class="axis-title" x="' + (HEAT_LEFT - 6) + '" y="' + (HEAT_TOP - 7) + '" text-anchor="end">second</text>');
    for (let s = 0; s < cols; s += step) {
      out.push('<text x="' + (HEAT_LEFT + s * cw + cw / 2) + '" y="' + (HEAT_TOP - 7) + '" text-anchor="middle">' + s + '</text>');
    }
    for (let r = 0; r < rows; r += 10) {
      out.push('<text x="' + (HEAT_LEFT - 6) + '" y="' + (HEAT_TOP + r * ch + Math.min(ch, 9)) + '" text-anchor="end">' + trim(r * slotMs, 1) + ' ms</text>');
    }
    for (let s = 1; s <= slots; s++) {
      const i = s - 1, col = Math.floor(i / rows), row = i % rows, c = perSlot[s];
      out.push('<rect class="cell" x="' + (HEAT_LEFT + col * cw) + '" y="' + (HEAT_TOP + row * ch) +
        '" width="' + (cw - 1) + '" height="' + (ch - 1) + '" fill="' + heatColor(c, max) +
        '" data-slot="' + s + '" data-second="' + col + '" data-row="' + row + '" data-count="' + c +
        '"><title>' + slotTime(i) + ' s: ' + esc(fmtCount(c)) + '</title></rect>');
    }
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    svg.innerHTML = out.join('');
    heat.cells = [null].concat(Array.from(svg.querySelectorAll('rect.cell')));

    const legend = $('heat-legend');
    legend.innerHTML = (DATA.heat.start ? 'Start ' + esc(DATA.heat.start) + ' · ' : '') +
      'a column per second, a row per ' + esc(trim(slotMs, 3)) + ' ms · ' +
      '<span class="heat-scale"></span> 0 to ' + esc(fmtCount(max)) + ' a cell · drag across cells to select a range';
    wireHeat(svg);
  }

  // Outlines the cells of slots lo..hi, and only those.
  function markCells(lo, hi) {
    const cells = heat.cells;
    if (!cells) return;
    for (let s = heat.lo; s <= heat.hi; s++) if (s < lo || s > hi) cells[s].classList.remove('selected');
    for (let s = lo; s <= hi; s++) if (s < heat.lo || s > heat.hi) cells[s].classList.add('selected');
    heat.lo = lo;
    heat.hi = hi;
  }

  function wireHeat(svg) {
    let drag = null;

    // The slot under the pointer, from its coordinates rather than the
    // event's target: a touch keeps targeting the cell it started on, and
    // between cells or beyond the grid (clamped to it) a drag goes on.
    function slotAt(e, strict) {
      const r = svg.getBoundingClientRect();
      const sx = r.width ? svg.width.baseVal.value / r.width : 1;
      const sy = r.height ? svg.height.baseVal.value / r.height : 1;
      let col = Math.floor(((e.clientX - r.left) * sx - HEAT_LEFT) / heat.cw);
      let row = Math.floor(((e.clientY - r.top) * sy - HEAT_TOP) / heat.ch);
      if (strict && (col < 0 || col >= heat.cols || row < 0 || row >= heat.rows)) return 0;
      col = Math.max(0, Math.min(heat.cols - 1, col));
      row = Math.max(0, Math.min(heat.rows - 1, row));
      const s = col * heat.rows + row + 1;
      return strict && s > heat.slots ? 0 : Math.max(1, Math.min(heat.slots, s));
    }

    // Pointer events only: Chrome fires the mouse events after them too,
    // and handling both would start each drag twice.
    svg.addEventListener('pointerdown', (e) => {
      if (e.button !== 0 || !heat.slots) return;
      const t = e.target;
      const s = t.classList && t.classList.contains('cell') ? Number(t.getAttribute('data-slot')) : slotAt(e, true);
      if (!s) return;
      // Cancelling the pointerdown also stops the text selection a drag
      // would otherwise start.
      e.preventDefault();
      drag = { anchor: s, cur: s };
      document.body.classList.add('dragging');
      markCells(s, s);
    });
    window.addEventListener('pointermove', (e) => {
      if (!drag) return;
      const s = slotAt(e, false);
      if (s && s !== drag.cur) {
        drag.cur = s;
        markCells(Math.min(drag.anchor, s), Math.max(drag.anchor, s));
      }
    });
    const finish = (e) => {
      if (!drag) return;
      if (e.type === 'pointerup') {
        const s = slotAt(e, false);
        if (s) drag.cur = s;
      }
      const lo = Math.min(drag.anchor, drag.cur), hi = Math.max(drag.anchor, drag.cur);
      drag = null;
      document.body.classList.remove('dragging');
      setRange([lo, hi]);
    };
    window.addEventListener('pointerup', finish);
    window.addEventListener('pointercancel', finish);
    document.addEventListener('selectstart', (e) => { if (drag) e.preventDefault(); });
  }

  function showRange() {
    const span = $('range');
    const info = $('range-info');
    if (!range) {
      span.textContent = 'whole run';
      span.removeAttribute('data-first-slot');
      span.removeAttribute('data-last-slot');
      info.textContent = '(' + fmtCount(view.total) + ')';
    } else {
      span.textContent = slotTime(range[0] - 1) + '–' + slotTime(range[1]) + ' s';
      span.setAttribute('data-first-slot', range[0]);
      span.setAttribute('data-last-slot', range[1]);
      const slots = range[1] - range[0] + 1;
      info.textContent = '(' + slots + (slots === 1 ? ' slot, ' : ' slots, ') + fmtCount(view.total) + ')';
    }
  }

  function setRange(r) {
    range = r;
    if (r) markCells(r[0], r[1]);
    else markCells(0, -1);
    view = makeView(range);
    showRange();
    drawFlame();
    renderReport();
  }

  // --------------------------------------------------------- flame graph

  const ROW_H = 16, RECT_H = 15, PAD = 2, MIN_W = 0.5, TEXT_PAD = 3, FRAME_BUDGET = 4000;
  const flameSvg = $('flamegraph');
  let zoomNode = 0;
  let direction = null;
  let directionAuto = true;
  let lastLayout = null;
  let drawnNodes = [];
  let drawnEls = [];
  let matchFlag = null;
  let highlightName = null;

  // Frame labels are monospaced, so one measured advance fits them all.
  const CHAR_W = (() => {
    const ctx = document.createElement('canvas').getContext('2d');
    if (!ctx) return 7;
    ctx.font = getComputedStyle(flameSvg).font || '11px monospace';
    const w = ctx.measureText('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:').width / 64;
    return w > 0 ? w * 1.02 : 7;
  })();

  // Measured while the document is still small (a forced layout of the
  // finished page would cost more than drawing it), and again on resize.
  let flameW = 0;
  function measureFlame() {
    const w = $('flame-wrap').clientWidth;
    flameW = w > 0 ? Math.floor(w) : 1200;
  }
  measureFlame();
  const flameWidth = () => flameW;

  const nodeName = (n) => (n === 0 ? 'all' : cName[frameOf[n]]);

  function zoomPath(n) {
    const names = [];
    for (; n > 0; n = parent[n]) names.push(nodeName(n));
    return names.reverse().join(';');
  }

  // Which nodes to draw, where: the zoom root's ancestors full width, its
  // subtree scaled to the width, nodes under MIN_W left out (their counts
  // stay in their parents'). Where even so more than FRAME_BUDGET would
  // be drawn (long random tails of deep stacks, slivers nobody can see
  // or point at), the narrowest go too: SVG elements cost some 20 µs
  // each to create and lay out, and the page must open quickly.
  function layout() {
    const cnt = view.counts;
    let z = zoomNode;
    while (z > 0 && !(cnt[z] > 0)) z = parent[z];
    zoomNode = z;
    const W = flameWidth();
    let nodes = [], xs = [], ws = [];
    const anc = [];
    for (let a = parent[z]; a >= 0; a = parent[a]) anc.push(a);
    for (let i = anc.length - 1; i >= 0; i--) { nodes.push(anc[i]); xs.push(0); ws.push(W); }
    const ancestors = anc.length;
    let minW = MIN_W;
    const Z = cnt[z];
    if (Z > 0) {
      const scale = W / Z;
      const stackN = [z], stackX = [0];
      while (stackN.length) {
        const n = stackN.pop(), x = stackX.pop();
        nodes.push(n); xs.push(x); ws.push(cnt[n] * scale);
        let cx = x;
        for (let j = childStart[n], e = childStart[n + 1]; j < e; j++) {
          const c = childList[j], cc = cnt[c];
          if (cc === 0) continue;
          const cw = cc * scale;
          if (cw >= MIN_W) { stackN.push(c); stackX.push(cx); }
          cx += cw;
        }
      }
      if (nodes.length - ancestors > FRAME_BUDGET) {
        // A node is never wider than its parent, so keeping the widest
        // keeps every kept node's ancestors.
        const sorted = Float64Array.from(ws.slice(ancestors)).sort();
        let i = sorted.length - FRAME_BUDGET;
        minW = sorted[i];
        // Many frames of one width at the limit (one sample each, say)
        // go all together where keeping them would overshoot the budget.
        let from = i;
        while (from > 0 && sorted[from - 1] === minW) from--;
        if (sorted.length - from > FRAME_BUDGET * 1.2) {
          while (i < sorted.length && sorted[i] === minW) i++;
          if (i < sorted.length) minW = sorted[i];
        }
        const keepN = [], keepX = [], keepW = [];
        for (let i = 0; i < nodes.length; i++) {
          if (i < ancestors || ws[i] >= minW) { keepN.push(nodes[i]); keepX.push(xs[i]); keepW.push(ws[i]); }
        }
        nodes = keepN; xs = keepX; ws = keepW;
      }
    } else {
      nodes.push(z); xs.push(0); ws.push(W);
    }
    let maxDepth = 0;
    for (let i = 0; i < nodes.length; i++) if (depth[nodes[i]] > maxDepth) maxDepth = depth[nodes[i]];
    return { W, nodes, xs, ws, ancestors, maxDepth, minW, height: (maxDepth + 1) * ROW_H + 2 * PAD, zoom: z };
  }

  function fitLabel(name, w) {
    const room = Math.floor((w - 2 * TEXT_PAD) / CHAR_W);
    if (room < 3) return '';
    if (name.length <= room) return name;
    return name.slice(0, room - 2) + '..';
  }

  // Per frame, what every node of it shares: its name and kind as
  // attributes, escaped once.
  const attrCache = new Array(NC);
  function frameAttrs(c) {
    let a = attrCache[c];
    if (a === undefined) a = attrCache[c] = '" data-name="' + esc(cName[c]) + '" data-kind="' + esc(kindName(cKind[c]));
    return a;
  }

  function frameTitle(n) {
    const c = view.counts[n];
    let t = nodeName(n) + ' (' + fmtCount(c) + ', ' + pct(c / view.total) + ')';
    if (n > 0) t += '\n' + moduleName(moduleOf[n]) + ' · ' + kindName(cKind[frameOf[n]]);
    if (DIFF) {
      const b = view.before[n];
      const d = c / view.total - b / view.totalBefore;
      t += '\nbefore ' + fmtCount(b) + ' (' + pct(b / view.totalBefore) + '), after ' + fmtCount(c) +
        ' (' + pct(c / view.total) + '): ' + signedPoints(d);
    }
    return t;
  }

  const signedPoints = (d) => (isFinite(d) ? (d >= 0 ? '+' : '−') + Math.abs(d * 100).toFixed(2) + ' points' : 'n/a');

  // Why the graph is drawn as it is: said when the direction is chosen,
  // on the whole tree, and kept while zooming.
  let directionWhy = '';
  function directionNote() {
    const shown = direction === 'icicle'
      ? 'Icicle graph (roots at the top)'
      : 'Flame graph (roots at the bottom)';
    return directionAuto ? shown + ': ' + directionWhy : shown + ', as chosen; ' + directionWhy;
  }

  function drawFlame() {
    const L = layout();
    lastLayout = L;
    if (direction === null) {
      // Decided once, on the whole tree: a system-wide graph is some
      // 1350 px tall, and drawn as flames its roots (where reading
      // starts) sit below the first screen. The room is the window's
      // less the controls above the graph.
      const room = Math.max(300, window.innerHeight - 120);
      const size = 'the tree is ' + L.maxDepth + ' frames deep (' + L.height + ' px)';
      if (L.height > room) {
        direction = 'icicle';
        directionWhy = size + ', taller than the window, so a flame graph would put its roots below the first screen.';
      } else {
        direction = 'flame';
        directionWhy = size + ' and fits in the window.';
      }
    }
    const cnt = view.counts, total = view.total;
    const icicle = direction === 'icicle';
    const H = L.height, W = L.W;
    const round = (v) => Math.round(v * 100) / 100;
    const out = [];
    for (let i = 0; i < L.nodes.length; i++) {
      const n = L.nodes[i], x = round(L.xs[i]), w = L.ws[i], d = depth[n];
      const f = n === 0 ? -1 : frameOf[n];
      const y = icicle ? PAD + d * ROW_H : H - PAD - (d + 1) * ROW_H;
      // Classes are written in rather than toggled afterwards: one pass
      // over thousands of elements less.
      let cls = i < L.ancestors ? 'frame ancestor' : 'frame';
      if (f >= 0) {
        if (matchFlag && matchFlag[f]) cls += ' match';
        if (highlightName !== null && cName[f] === highlightName) cls += ' highlight';
      }
      let fill, extra = '';
      if (DIFF) {
        const b = view.before[n];
        fill = diffColor(cnt[n] / total - b / view.totalBefore);
        extra = ' data-before="' + b + '" data-after="' + cnt[n] + '"';
      } else {
        fill = f < 0 ? 'rgb(200,200,205)' : frameColor(f);
      }
      out.push('<g class="' + cls + '" data-n="' + n + (f < 0 ? '" data-name="all" data-kind="root' : frameAttrs(f)) +
        '" data-count="' + cnt[n] + '" data-depth="' + d + '"' + extra + '><title>' + esc(frameTitle(n)) +
        '</title><rect x="' + x + '" y="' + y + '" width="' + round(w) + '" height="' + RECT_H +
        '" rx="2" fill="' + fill + '"/><text x="' + round(x + TEXT_PAD) + '" y="' + (y + 11.5) + '">' +
        esc(fitLabel(nodeName(n), w)) + '</text></g>');
    }
    if (!(total > 0)) {
      out.push('<text class="empty" x="' + W / 2 + '" y="' + (H + 18) + '" text-anchor="middle">' +
        (range ? 'No samples in this range.' : 'No samples.') + '</text>');
    }
    const height = total > 0 ? H : H + 30;
    flameSvg.setAttribute('width', W);
    flameSvg.setAttribute('height', height);
    flameSvg.setAttribute('viewBox', '0 0 ' + W + ' ' + height);
    flameSvg.setAttribute('data-direction', direction);
    if (L.zoom > 0) flameSvg.setAttribute('data-zoom', zoomPath(L.zoom));
    else flameSvg.removeAttribute('data-zoom');
    flameSvg.innerHTML = out.join('');
    drawnNodes = L.nodes;
    drawnEls = flameSvg.querySelectorAll('g.frame');
    $('direction').textContent = icicle ? 'Show as flame graph' : 'Show as icicle graph';
    $('direction-note').textContent = directionNote();
    $('flame-note').textContent = L.minW > MIN_W
      ? 'Frames narrower than ' + L.minW.toFixed(2) + ' px are left out (counted in their parents).'
      : '';
    showShare();
    showDetails(-1);
  }

  function zoomTo(n) {
    zoomNode = n;
    drawFlame();
  }

  // ---------------------------------------------------------------- search

  function setSearch(q) {
    if (!q) {
      matchFlag = null;
    } else {
      let re = null;
      try { re = new RegExp(q); } catch (e) { re = null; }
      matchFlag = new Uint8Array(NC);
      for (let c = 0; c < NC; c++) matchFlag[c] = re ? (re.test(cName[c]) ? 1 : 0) : (cName[c].includes(q) ? 1 : 0);
    }
    applySearch();
  }

  function applySearch() {
    for (let i = 0; i < drawnEls.length; i++) {
      const n = drawnNodes[i];
      drawnEls[i].classList.toggle('match', !!matchFlag && n > 0 && matchFlag[frameOf[n]] === 1);
    }
    showShare();
  }

  // Says what share of the zoom root's samples have a matching frame: a
  // match under a match adds nothing, and a matching ancestor of the zoom
  // root covers all of it.
  function showShare() {
    const out = $('match-share');
    if (!matchFlag) {
      out.textContent = '';
      out.removeAttribute('data-share');
      out.removeAttribute('data-count');
      return;
    }
    const cnt = view.counts, z = zoomNode, Z = cnt[z];
    let m = 0, covered = false;
    for (let a = z; a > 0; a = parent[a]) if (matchFlag[frameOf[a]]) covered = true;
    if (covered) {
      m = Z;
    } else {
      const stack = [z];
      while (stack.length) {
        const n = stack.pop();
        for (let j = childStart[n], e = childStart[n + 1]; j < e; j++) {
          const c = childList[j];
          if (cnt[c] === 0) continue;
          if (matchFlag[frameOf[c]]) m += cnt[c];
          else stack.push(c);
        }
      }
    }
    const share = Z > 0 ? m / Z : 0;
    out.textContent = 'Matched: ' + (share * 100).toFixed(1) + '% (' + fmtOf(m, Z) + ')';
    out.setAttribute('data-share', String(share));
    out.setAttribute('data-count', String(m));
  }

  function applyHighlight() {
    for (let i = 0; i < drawnEls.length; i++) {
      const n = drawnNodes[i];
      drawnEls[i].classList.toggle('highlight', highlightName !== null && n > 0 && cName[frameOf[n]] === highlightName);
    }
  }

  // --------------------------------------------------------------- details

  const DETAILS_IDLE = 'Hover over a frame for details; click one to zoom into it, Escape to zoom out.';

  function showDetails(n) {
    const el = $('details');
    if (n < 0) { el.textContent = DETAILS_IDLE; return; }
    const cnt = view.counts, c = cnt[n];
    const parts = [nodeName(n)];
    if (n > 0) {
      const f = frameOf[n];
      parts.push(moduleName(moduleOf[n]) + ' (' + kindName(cKind[f]) + ')');
    }
    let share = fmtCount(c) + ', ' + pct(c / view.total) + ' of all';
    if (zoomNode > 0 && cnt[zoomNode] > 0) share += ', ' + pct(c / cnt[zoomNode]) + ' of the zoomed frame';
    parts.push(share);
    if (DIFF) {
      const b = view.before[n];
      parts.push('before ' + fmtCount(b) + ' (' + pct(b / view.totalBefore) + '): ' + signedPoints(c / view.total - b / view.totalBefore));
    }
    el.textContent = parts.join(' — ');
  }

  flameSvg.addEventListener('click', (e) => {
    const g = e.target.closest && e.target.closest('g.frame');
    if (g) zoomTo(Number(g.getAttribute('data-n')));
  });
  flameSvg.addEventListener('mouseover', (e) => {
    const g = e.target.closest && e.target.closest('g.frame');
    showDetails(g ? Number(g.getAttribute('data-n')) : -1);
  });
  flameSvg.addEventListener('mouseleave', () => showDetails(-1));

  // ---------------------------------------------------------------- report

  const REPORT_ROWS = 200;
  let sortKey = DIFF ? 'delta' : 'total';
  let sortDesc = true;
  const NUMERIC = { total: true, self: true, delta: true };

  if (DIFF) {
    const th = document.createElement('th');
    th.setAttribute('data-key', 'delta');
    th.className = 'num';
    th.title = 'Self share after minus before, in percentage points';
    th.textContent = 'Δ Self';
    $('report').tHead.rows[0].appendChild(th);
  }

  // The rank of each report key by a text column, for sorting by it
  // numerically; made on the first sort by that column.
  const rankCache = {};
  function stringRank(key) {
    if (rankCache[key]) return rankCache[key];
    const str = { comm: kComm, module: kModule, name: kName }[key];
    const order = Array.from({ length: NK }, (_, i) => i);
    order.sort((a, b) => (str[a] < str[b] ? -1 : str[a] > str[b] ? 1 : 0));
    const rank = new Float64Array(NK);
    for (let i = 0, r = 0; i < NK; i++) {
      if (i > 0 && str[order[i]] !== str[order[i - 1]]) r = i;
      rank[order[i]] = r;
    }
    return (rankCache[key] = rank);
  }

  function renderReport() {
    const K = view.keys, T = view.total;
    const B = view.keysBefore, TB = view.totalBefore;
    const delta = DIFF ? new Float64Array(NK) : null;
    const all = [];
    for (let k = 0; k < NK; k++) {
      if (K.total[k] > 0 || (B && B.total[k] > 0)) {
        all.push(k);
        if (DIFF) delta[k] = (T > 0 ? K.self[k] / T : 0) - (TB > 0 ? B.self[k] / TB : 0);
      }
    }
    const value = sortKey === 'total' ? K.total : sortKey === 'self' ? K.self : sortKey === 'delta' ? delta : stringRank(sortKey);
    const dir = sortDesc ? -1 : 1;
    // Only the first REPORT_ROWS are shown: a numeric sort (native, fast)
    // finds the value the last of them has, and only the rows up to it
    // are sorted in full.
    let rows = all;
    if (all.length > REPORT_ROWS) {
      const vals = new Float64Array(all.length);
      for (let i = 0; i < all.length; i++) vals[i] = dir * value[all[i]];
      vals.sort();
      const limit = vals[REPORT_ROWS - 1];
      rows = all.filter((k) => dir * value[k] <= limit);
    }
    rows.sort((a, b) => (dir * (value[a] - value[b])) ||
      (K.total[b] - K.total[a]) || (kName[a] < kName[b] ? -1 : kName[a] > kName[b] ? 1 : 0));
    const shown = Math.min(rows.length, REPORT_ROWS);
    const out = [];
    for (let i = 0; i < shown; i++) {
      const k = rows[i];
      const tot = K.total[k], self = K.self[k];
      const share = T > 0 ? tot / T : 0;
      out.push('<tr' + (kName[k] === highlightName ? ' class="active"' : '') + ' data-name="' + esc(kName[k]) +
        '" data-comm="' + esc(kComm[k]) + '" data-module="' + esc(kModule[k]) + '" data-total="' + tot +
        '" data-self="' + self + '"><td class="num bar" style="--w:' + (share * 100).toFixed(1) + '%" title="' +
        esc(fmtCount(tot)) + '">' + pct(share) + '</td><td class="num" title="' + esc(fmtCount(self)) + '">' +
        pct(T > 0 ? self / T : 0) + '</td><td>' + esc(kComm[k]) + '</td><td class="module" title="' +
        esc(kModule[k]) + '">' + esc(baseName(kModule[k])) + '</td><td class="name"><span class="kind-dot" style="background:' +
        kindColor(kindName(kKind[k]), 0.5) + '" title="' + esc(kindName(kKind[k])) + '"></span>' + esc(kName[k]) + '</td>' +
        (DIFF ? '<td class="num ' + (delta[k] > 0 ? 'up' : delta[k] < 0 ? 'down' : '') + '" data-delta="' + delta[k] +
          '">' + (delta[k] >= 0 ? '+' : '−') + Math.abs(delta[k] * 100).toFixed(2) + '%</td>' : '') + '</tr>');
    }
    const table = $('report');
    table.tBodies[0].innerHTML = out.join('');
    for (const th of table.tHead.rows[0].cells) {
      const key = th.getAttribute('data-key');
      th.classList.toggle('sorted', key === sortKey);
      th.classList.toggle('asc', key === sortKey && !sortDesc);
      if (key === sortKey) th.setAttribute('aria-sort', sortDesc ? 'descending' : 'ascending');
      else th.removeAttribute('aria-sort');
    }
    const what = all.length === 1 ? ' symbol' : ' symbols';
    $('report-note').textContent = (all.length > shown
      ? 'The top ' + shown + ' of ' + all.length + what + ' (' + (all.length - shown) + ' hidden), '
      : all.length + what + ', ') +
      'in ' + (range ? 'the range ' + $('range').textContent : 'the whole run') +
      '; percentages of ' + fmtCount(T) + '. Click a row to mark its frames in the flame graph.';
  }

  $('report').tHead.addEventListener('click', (e) => {
    const th = e.target.closest('th');
    if (!th) return;
    const key = th.getAttribute('data-key');
    if (key === sortKey) sortDesc = !sortDesc;
    else { sortKey = key; sortDesc = !!NUMERIC[key]; }
    renderReport();
  });

  $('report').tBodies[0].addEventListener('click', (e) => {
    const tr = e.target.closest('tr');
    if (!tr) return;
    const name = tr.getAttribute('data-name');
    highlightName = highlightName === name ? null : name;
    for (const row of $('report').tBodies[0].rows) row.classList.toggle('active', row.getAttribute('data-name') === highlightName);
    applyHighlight();
    if (highlightName !== null) $('flame-section').scrollIntoView({ block: 'start' });
  });

  // -------------------------------------------------------------- controls

  // 'input' as typed; 'change' and 'search' too, since clearing the box
  // by script or by its clear button need not fire 'input'.
  for (const type of ['input', 'change', 'search']) {
    $('search').addEventListener(type, (e) => setSearch(e.target.value));
  }
  $('reset').addEventListener('click', () => zoomTo(0));
  $('clear-range').addEventListener('click', () => setRange(null));
  $('direction').addEventListener('click', () => {
    direction = direction === 'icicle' ? 'flame' : 'icicle';
    directionAuto = false;
    drawFlame();
  });

  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') {
      if (zoomNode !== 0) zoomTo(0);
    } else if ((e.ctrlKey || e.metaKey) && (e.key === 'f' || e.key === 'F') && document.activeElement !== $('search')) {
      // A second Ctrl-F, from the search box, is the browser's own.
      e.preventDefault();
      $('search').focus();
      $('search').select();
    }
  });

  // The graph is laid out in pixels of its container: redrawn when the
  // window changes its width.
  let resizePending = false;
  window.addEventListener('resize', () => {
    if (resizePending) return;
    resizePending = true;
    requestAnimationFrame(() => {
      resizePending = false;
      measureFlame();
      if (lastLayout && flameW !== lastLayout.W) drawFlame();
    });
  });

  // ------------------------------------------------------------------ init

  if (DIFF) {
    const legend = $('diff-legend');
    legend.innerHTML = 'Differential: the frames of <b>' + esc(MAIN.name || 'after') + '</b> (' + esc(fmtCount(view.total)) +
      '), coloured by the change of their share since <b>' + esc(BEFORE.name || 'before') + '</b> (' +
      esc(fmtCount(view.totalBefore)) + '): <span class="diff-scale"></span> blue shrank, grey unchanged, red grew ' +
      '(full colour at ±' + DIFF_SATURATION * 100 + ' points). Frames only in ' + esc(BEFORE.name || 'before') + ' are not drawn.';
    legend.hidden = false;
  }

  buildHeat();
  showRange();
  drawFlame();
  renderReport();
  // A search typed (or restored by the browser) before the script ran.
  if ($('search').value) setSearch($('search').value);

  document.body.dataset.ready = '1';
  window.rtraceLoadMs = performance.now();
})();
