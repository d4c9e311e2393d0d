//! A check's verdict and how reports are printed (text or `--json`).

use std::fmt::Display;

use serde_json::{Value, json};

/// `n` with the words that agree with it: `plural(1, "warning", "warnings")` is
/// `1 warning`, `plural(2, …)` is `2 warnings`, and `plural(0, …)` is
/// `0 warnings`. The words may carry their verb (`"replica is"`, `"replicas
/// are"`). Every count the command prints goes through it.
pub(crate) fn plural<N>(n: N, one: &str, many: &str) -> String
where
    N: Display + PartialEq + From<u8>,
{
    let words = if n == N::from(1) { one } else { many };
    format!("{n} {words}")
}

/// Pass, unknown (the data could not be read), warn or fail; in that order of
/// severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    Pass,
    Unknown,
    Warn,
    Fail,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Unknown => "unknown",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check of a report: a stable id, the verdict, what was found, and the fix.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub(crate) id: &'static str,
    pub(crate) verdict: Verdict,
    pub(crate) detail: String,
    pub(crate) fix: Option<String>,
}

impl Check {
    pub(crate) fn pass(id: &'static str, detail: impl Into<String>) -> Check {
        Check {
            id,
            verdict: Verdict::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    pub(crate) fn warn(
        id: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(id, Verdict::Warn, detail.into(), fix.into())
    }

    /// The data of the check could not be read; `fix` names what is missing.
    pub(crate) fn unknown(
        id: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(id, Verdict::Unknown, detail.into(), fix.into())
    }

    pub(crate) fn fail(
        id: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(id, Verdict::Fail, detail.into(), fix.into())
    }

    fn with_fix(id: &'static str, verdict: Verdict, detail: String, fix: String) -> Check {
        Check {
            id,
            verdict,
            detail,
            fix: Some(fix),
        }
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "id": self.id,
            "verdict": self.verdict.as_str(),
            "detail": self.detail,
            "fix": self.fix,
        })
    }
}

/// Prints `checks` about `target`, and returns the worst verdict.
pub(crate) fn print_checks(title: &str, target: &str, checks: &[Check], json: bool) -> Verdict {
    let worst = checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Pass);
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    if json {
        let report = json!({
            "command": title,
            "target": target,
            "checks": checks.iter().map(Check::json).collect::<Vec<_>>(),
            "summary": {
                "pass": count(Verdict::Pass),
                "unknown": count(Verdict::Unknown),
                "warn": count(Verdict::Warn),
                "fail": count(Verdict::Fail),
                "verdict": worst.as_str(),
            },
        });
        println!("{report:#}");
    } else {
        println!("lockflight {title} {target}");
        for c in checks {
            println!("  [{:<7}] {:<20} {}", c.verdict.as_str(), c.id, c.detail);
            if let Some(fix) = &c.fix {
                println!("            {:<20} fix: {fix}", "");
            }
        }
        println!(
            "{} passed, {} unknown, {}, {} failed",
            count(Verdict::Pass),
            count(Verdict::Unknown),
            plural(count(Verdict::Warn), "warning", "warnings"),
            count(Verdict::Fail)
        );
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::plural;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(plural(0usize, "warning", "warnings"), "0 warnings");
        assert_eq!(plural(1usize, "warning", "warnings"), "1 warning");
        assert_eq!(plural(2u64, "warning", "warnings"), "2 warnings");
        assert_eq!(plural(1u32, "replica is", "replicas are"), "1 replica is");
        assert_eq!(plural(-1i64, "unit", "units"), "-1 units");
    }
}
