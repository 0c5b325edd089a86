//! Filters of probe specs: expressions joined by `&&` and `||`, some of
//! them comparing a string with `"text"`, compiled to the generic
//! program's conditions.

use rtrace_common::argdist::{CMP_EQ, CMP_NE, Cond, MAX_CONDS, STR_LEN, VAL_STRING, VAL_USER};

use super::{Expr, ExprParser, SpecError, err};

impl ExprParser<'_> {
    /// Terms joined by `&&` and `||` at the top level: each a string
    /// comparison or a number that must be nonzero. A filter with no
    /// string in it is one expression. Returns whether it needs the
    /// entry of a return probe.
    pub(in super::super) fn filter(&mut self) -> Result<(Vec<Cond>, bool), SpecError> {
        let start = self.pos;
        if !self.text.contains('"') {
            let e = self.expr()?;
            self.end()?;
            let at = self.at + start;
            let entry = e.needs_entry();
            if e.special.is_some() || e.ty.c.string {
                return err(at, "a string compares with a \"string\"");
            }
            let mut value = e.value(at)?;
            value.size = 8;
            return Ok((
                vec![Cond {
                    value,
                    cmp: CMP_NE,
                    or_next: 0,
                    text: [0; STR_LEN],
                }],
                entry,
            ));
        }
        let mut conds = Vec::new();
        let mut entry = false;
        loop {
            if conds.len() == MAX_CONDS {
                return err(
                    self.col(),
                    format!("at most {MAX_CONDS} terms with strings in them"),
                );
            }
            let (c, e) = self.cond()?;
            entry |= e;
            conds.push(c);
            if self.eat("||") {
                conds.last_mut().expect("just pushed").or_next = 1;
            } else if !self.eat("&&") {
                break;
            }
        }
        self.end()?;
        Ok((conds, entry))
    }

    /// One term of a filter with strings: `expr == "text"`, `expr !=
    /// "text"`, bcc's `STRCMP("text", expr)`, or a number above `&&`.
    fn cond(&mut self) -> Result<(Cond, bool), SpecError> {
        self.skip_ws();
        let at = self.col();
        if self.eat("STRCMP(") {
            let text = self.string()?;
            if !self.eat(",") {
                return err(self.col(), "expected , after the string");
            }
            let e = self.binary(2)?;
            if !self.eat(")") {
                return err(self.col(), "expected )");
            }
            return self.string_cond(at, e, CMP_EQ, &text);
        }
        // Above `&&`, so that the loop sees the joins.
        let e = self.binary(2)?;
        self.skip_ws();
        let save = self.pos;
        let cmp = if self.eat("==") {
            Some(CMP_EQ)
        } else if self.eat("!=") {
            Some(CMP_NE)
        } else {
            None
        };
        if let Some(cmp) = cmp {
            self.skip_ws();
            if self.rest().starts_with('"') {
                let text = self.string()?;
                return self.string_cond(at, e, cmp, &text);
            }
            self.pos = save;
        }
        if e.special.is_some() {
            return err(self.col(), "a string compares with a \"string\"");
        }
        let entry = e.needs_entry();
        let mut value = e.value(at)?;
        value.size = 8;
        Ok((
            Cond {
                value,
                cmp: CMP_NE,
                or_next: 0,
                text: [0; STR_LEN],
            },
            entry,
        ))
    }

    fn string_cond(
        &self,
        at: usize,
        e: Expr,
        cmp: u32,
        text: &str,
    ) -> Result<(Cond, bool), SpecError> {
        if !(e.ty.c.string || e.ty.c.size == 8 || e.special.is_some()) {
            return err(
                at,
                "only a string (char*, $COMM) compares with a \"string\"",
            );
        }
        if text.len() >= STR_LEN {
            return err(at, format!("strings are kept to {} bytes", STR_LEN - 1));
        }
        let entry = e.needs_entry();
        let mut value = e.value(at)?;
        value.flags = VAL_STRING
            | if e.ty.c.user || self.scope.user {
                VAL_USER
            } else {
                0
            };
        let mut buf = [0; STR_LEN];
        buf[..text.len()].copy_from_slice(text.as_bytes());
        Ok((
            Cond {
                value,
                cmp,
                or_next: 0,
                text: buf,
            },
            entry,
        ))
    }

    fn string(&mut self) -> Result<String, SpecError> {
        self.skip_ws();
        let at = self.col();
        if !self.eat("\"") {
            return err(at, "expected a \"string\"");
        }
        let Some(end) = self.rest().find('"') else {
            return err(at, "unterminated string");
        };
        let s = self.rest()[..end].to_owned();
        self.pos += end + 1;
        Ok(s)
    }
}
