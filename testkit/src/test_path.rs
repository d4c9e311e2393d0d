//! The path by which libtest names a test, for running that one test again in a
//! child process (`--exact`), wherever its module sits in the test binary.

/// The name libtest gives the test function `test` of the module whose
/// `module_path!()` is `module`: that path without the crate's own name, then
/// `test`. Call it as `test_path(module_path!(), "child")`, so that moving a test
/// file into another module (or another binary) does not break its children.
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_crate, within)) => format!("{within}::{test}"),
        None => test.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_path;

    #[test]
    fn the_crate_name_is_left_out() {
        assert_eq!(test_path("locks", "child"), "child");
        assert_eq!(test_path("locks::caching", "child"), "caching::child");
        assert_eq!(test_path("locks::a::b", "child"), "a::b::child");
    }
}
