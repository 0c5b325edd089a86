//! `rtrace top`'s interactive view: the rows drawn full-screen with
//! ratatui on the terminal's alternate screen, redrawn at every refresh
//! and at every key. Keys are read on a thread of their own; `q` and
//! Ctrl-C end the run as a SIGINT does (the tracer then stops), and the
//! terminal is given back as it was when the view is dropped.

use std::{
    io::Stdout,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use crossterm::{
    cursor::{Hide, Show},
    event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
    execute,
    terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
};
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Paragraph, Row as TableRow, Table, TableState},
};

use super::{Func, Model, Sort, short_module};
use crate::stacks::sample::Sample;

/// What the keys have chosen.
struct State {
    sort: Sort,
    /// Rows whose symbol or command holds this text.
    filter: String,
    /// The filter being typed (after `/`).
    typing: bool,
    kernel: bool,
    user: bool,
    paused: bool,
    selected: usize,
    /// The function whose callers and callees are shown (Enter).
    detail: Option<Func>,
    /// The selected function's instructions, annotated (`a`).
    annotation: Option<String>,
    /// The first line of it shown (Up, Down).
    scroll: u16,
}

/// Refreshes whose samples `a` annotates from.
const ANNOTATED_REFRESHES: usize = 10;

/// The model, the keys' choices and the terminal, drawn together.
struct Screen {
    model: Model,
    /// The last refreshes' samples, whose leaves are exact addresses.
    recent: std::collections::VecDeque<Vec<Sample>>,
    state: State,
    term: Terminal<CrosstermBackend<Stdout>>,
    freq: u64,
    delay: f64,
}

/// The view, while it is shown.
pub struct Live {
    screen: Arc<Mutex<Screen>>,
    stop: Arc<AtomicBool>,
    keys: Option<JoinHandle<()>>,
}

impl Live {
    /// Takes the terminal over and starts reading keys.
    pub fn start(freq: u64, delay: f64) -> std::io::Result<Self> {
        enable_raw_mode()?;
        let mut out = std::io::stdout();
        if let Err(e) = execute!(out, EnterAlternateScreen, Hide) {
            let _ = disable_raw_mode();
            return Err(e);
        }
        let term = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        let screen = Arc::new(Mutex::new(Screen {
            model: Model::default(),
            recent: std::collections::VecDeque::new(),
            state: State {
                sort: Sort::SelfShare,
                filter: String::new(),
                typing: false,
                kernel: true,
                user: true,
                paused: false,
                selected: 0,
                detail: None,
                annotation: None,
                scroll: 0,
            },
            term,
            freq,
            delay,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let keys = {
            let (screen, stop) = (Arc::clone(&screen), Arc::clone(&stop));
            std::thread::spawn(move || read_keys(&screen, &stop))
        };
        let live = Self {
            screen,
            stop,
            keys: Some(keys),
        };
        live.draw();
        Ok(live)
    }

    /// A refresh: the interval's samples (unless paused), and the view
    /// redrawn.
    pub fn update(&self, samples: &[Sample], keep: f64, own: f64) {
        if let Ok(mut s) = self.screen.lock() {
            if !s.state.paused {
                s.model.add(samples, keep);
                s.model.own = own;
                s.recent.push_back(samples.to_vec());
                if s.recent.len() > ANNOTATED_REFRESHES {
                    s.recent.pop_front();
                }
            }
            s.draw();
        }
    }

    fn draw(&self) {
        if let Ok(mut s) = self.screen.lock() {
            s.draw();
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(k) = self.keys.take() {
            let _ = k.join();
        }
        let _ = disable_raw_mode();
        let _ = execute!(std::io::stdout(), Show, LeaveAlternateScreen);
    }
}

/// Reads keys until the view is dropped.
fn read_keys(screen: &Mutex<Screen>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(true) = event::poll(Duration::from_millis(100)) else {
            continue;
        };
        let Ok(Event::Key(key)) = event::read() else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        let Ok(mut s) = screen.lock() else { return };
        if s.key(key) {
            // Ends the run as Ctrl-C would outside raw mode: the tracer
            // stops, and dropping the view restores the terminal.
            // SAFETY: signalling one's own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
            return;
        }
        s.draw();
    }
}

impl Screen {
    /// Handles a key; whether it asks to quit.
    fn key(&mut self, key: KeyEvent) -> bool {
        let st = &mut self.state;
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return true;
        }
        if st.typing {
            match key.code {
                KeyCode::Enter => st.typing = false,
                KeyCode::Esc => {
                    st.typing = false;
                    st.filter.clear();
                }
                KeyCode::Backspace => {
                    st.filter.pop();
                }
                KeyCode::Char(c) => st.filter.push(c),
                _ => {}
            }
            st.selected = 0;
            return false;
        }
        if st.annotation.is_some() {
            match key.code {
                KeyCode::Char('q') => return true,
                KeyCode::Down | KeyCode::Char('j') => st.scroll = st.scroll.saturating_add(1),
                KeyCode::Up => st.scroll = st.scroll.saturating_sub(1),
                KeyCode::PageDown | KeyCode::Char(' ') => st.scroll = st.scroll.saturating_add(20),
                KeyCode::PageUp => st.scroll = st.scroll.saturating_sub(20),
                KeyCode::Enter | KeyCode::Esc | KeyCode::Left | KeyCode::Char('a') => {
                    st.annotation = None;
                }
                _ => {}
            }
            return false;
        }
        if st.detail.is_some() {
            match key.code {
                KeyCode::Char('q') => return true,
                KeyCode::Enter | KeyCode::Esc | KeyCode::Left => st.detail = None,
                _ => {}
            }
            return false;
        }
        match key.code {
            KeyCode::Char('q') => return true,
            KeyCode::Char('s') => st.sort = Sort::SelfShare,
            KeyCode::Char('t') => st.sort = Sort::Total,
            KeyCode::Char('c') => st.sort = Sort::Comm,
            KeyCode::Char('o') => st.sort = Sort::Dso,
            KeyCode::Char('/') => {
                st.typing = true;
                st.filter.clear();
            }
            KeyCode::Esc => st.filter.clear(),
            KeyCode::Char('k') => st.kernel = !st.kernel,
            KeyCode::Char('u') => st.user = !st.user,
            KeyCode::Char('p') => st.paused = !st.paused,
            KeyCode::Down | KeyCode::Char('j') => st.selected += 1,
            KeyCode::Up => st.selected = st.selected.saturating_sub(1),
            KeyCode::Enter => {
                let rows = visible(&self.model, &self.state);
                let at = self.state.selected.min(rows.len().saturating_sub(1));
                self.state.detail = rows.get(at).map(|(f, _)| (*f).clone());
            }
            KeyCode::Char('a') => {
                let rows = visible(&self.model, &self.state);
                let at = self.state.selected.min(rows.len().saturating_sub(1));
                if let Some((f, _)) = rows.get(at) {
                    let name = f.name.to_string();
                    self.state.annotation = Some(self.annotate(&name));
                    self.state.scroll = 0;
                }
            }
            _ => {}
        }
        false
    }

    /// perf annotate's view of function `name` from the last refreshes'
    /// samples, or why there is none.
    fn annotate(&self, name: &str) -> String {
        let samples: Vec<Sample> = self.recent.iter().flatten().cloned().collect();
        let args = crate::output::stacks::annotate::AnnotateArgs {
            functions: vec![name.to_owned()],
            annotate_top: None,
        };
        let (out, skipped) =
            crate::output::stacks::annotate::annotate_quietly(&samples, &args, None);
        let mut text = String::new();
        crate::output::Record::text(&out, &mut text);
        for s in skipped {
            text.push_str(&format!("cannot annotate {s}\n"));
        }
        text.push_str("\nUp, Down, Space: scroll; Enter, Esc or a: back\n");
        text
    }

    fn draw(&mut self) {
        let Self {
            model,
            state,
            term,
            freq,
            delay,
            ..
        } = self;
        let rows = visible(model, state);
        let total = model.samples.max(1e-9);
        let sort = match state.sort {
            Sort::SelfShare => "self",
            Sort::Total => "children",
            Sort::Comm => "comm",
            Sort::Dso => "shared object",
        };
        let head = format!(
            "rtrace top: {} samples in {delay:.1} s at {freq} Hz, {:.0} decayed; rtrace's own CPU {:.1}%{}",
            model.new,
            model.samples,
            model.own,
            if state.paused { "  [paused]" } else { "" }
        );
        let mut flags = format!("sort: {sort}");
        if !state.filter.is_empty() || state.typing {
            flags.push_str(&format!(
                "  filter: {}{}",
                state.filter,
                if state.typing { "_" } else { "" }
            ));
        }
        if !state.kernel {
            flags.push_str("  kernel frames hidden");
        }
        if !state.user {
            flags.push_str("  user frames hidden");
        }
        let help = "s/t/c/o sort  / filter  k/u kernel/user  Enter callers+callees  a annotate  \
                    p pause  q quit";
        let detail = state.detail.clone();
        let annotation = state.annotation.clone();
        let scroll = state.scroll;
        let selected = state.selected.min(rows.len().saturating_sub(1));
        state.selected = selected;
        let _ = term.draw(|f| {
            let [top, body, foot] = Layout::vertical([
                Constraint::Length(2),
                Constraint::Min(1),
                Constraint::Length(1),
            ])
            .areas(f.area());
            f.render_widget(
                Paragraph::new(vec![Line::from(head.clone()), Line::from(flags.clone())]),
                top,
            );
            f.render_widget(Paragraph::new(help), foot);
            if let Some(text) = &annotation {
                let lines: Vec<Line> = text.lines().map(|l| Line::from(expand_tabs(l))).collect();
                f.render_widget(Paragraph::new(lines).scroll((scroll, 0)), body);
                return;
            }
            match &detail {
                None => {
                    let table = Table::new(
                        rows.iter().map(|(func, r)| {
                            let (comm, pid) = r.busiest();
                            TableRow::new(vec![
                                format!("{:6.2}%", r.self_count / total * 100.0),
                                format!("{:7.2}%", r.total_count / total * 100.0),
                                comm,
                                pid.to_string(),
                                short_module(func.module.as_deref()).to_owned(),
                                func.name.to_string(),
                            ])
                        }),
                        [
                            Constraint::Length(8),
                            Constraint::Length(9),
                            Constraint::Length(16),
                            Constraint::Length(8),
                            Constraint::Length(24),
                            Constraint::Min(10),
                        ],
                    )
                    .header(TableRow::new(vec![
                        "SELF",
                        "CHILDREN",
                        "COMM",
                        "PID",
                        "SHARED OBJECT",
                        "SYMBOL",
                    ]))
                    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
                    let mut ts = TableState::default().with_selected(Some(selected));
                    f.render_stateful_widget(table, body, &mut ts);
                }
                Some(func) => {
                    let lines = detail_lines(model, func, total);
                    f.render_widget(Paragraph::new(lines), body);
                }
            }
        });
    }
}

/// The rows the keys let through, in their order.
fn visible<'a>(model: &'a Model, st: &State) -> Vec<(&'a Func, &'a super::Row)> {
    let filter = st.filter.to_lowercase();
    model.sorted(st.sort, |f, r| {
        (if f.kernel { st.kernel } else { st.user })
            && (filter.is_empty()
                || f.name.to_lowercase().contains(&filter)
                || r.busiest().0.to_lowercase().contains(&filter))
    })
}

/// A function's callers and callees, with the share of its samples each
/// stands for.
fn detail_lines(model: &Model, func: &Func, total: f64) -> Vec<Line<'static>> {
    let Some(row) = model.rows.get(func) else {
        return vec![Line::from(format!("{}: no samples any more", func.name))];
    };
    let mut out = vec![
        Line::from(format!(
            "{}  [{}]  self {:.2}%  children {:.2}%",
            func.name,
            short_module(func.module.as_deref()),
            row.self_count / total * 100.0,
            row.total_count / total * 100.0
        )),
        Line::from(""),
        Line::from("Callers:"),
    ];
    let list = |m: &std::collections::HashMap<Func, f64>, out: &mut Vec<Line<'static>>| {
        let mut v: Vec<(&Func, &f64)> = m.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.name.cmp(&b.0.name)));
        if v.is_empty() {
            out.push(Line::from("  (none)"));
        }
        for (f, n) in v.into_iter().take(12) {
            out.push(Line::from(format!(
                "  {:6.2}%  {}  [{}]",
                n / row.total_count.max(1e-9) * 100.0,
                f.name,
                short_module(f.module.as_deref())
            )));
        }
    };
    list(&row.callers, &mut out);
    out.push(Line::from(""));
    out.push(Line::from("Callees:"));
    list(&row.callees, &mut out);
    out.push(Line::from(""));
    out.push(Line::from("Enter or Esc: back"));
    out
}

/// `line` with its tabs expanded to 8-column stops, as a terminal shows
/// them: the view draws cells, where a tab is one.
fn expand_tabs(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut col = 0;
    for c in line.chars() {
        if c == '\t' {
            let to = (col / 8 + 1) * 8;
            out.extend(std::iter::repeat_n(' ', to - col));
            col = to;
        } else {
            out.push(c);
            col += 1;
        }
    }
    out
}
