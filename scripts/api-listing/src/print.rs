//! Prints token streams on one line with the spacing rustfmt would give a
//! signature (`fn lock(&self, key: impl Into<LockKey>) -> Result<LockGuard>`), so
//! the listing reads like code and does not change with the source's line breaks.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;

/// One printed piece and what it is, for the spacing between two pieces.
#[derive(Clone, Copy, PartialEq)]
enum Atom {
    Word,
    /// A keyword after which a group takes a space (`impl (A, B)`, `dyn (…)`).
    Keyword,
    Open(char),
    Close(char),
    Punct(char, Spacing),
    Literal,
}

/// `tokens` on one line.
pub(crate) fn tokens(tokens: &impl ToTokens) -> String {
    let mut atoms = Vec::new();
    flatten(tokens.to_token_stream(), &mut atoms);
    join(&atoms)
}

fn flatten(stream: TokenStream, out: &mut Vec<(Atom, String)>) {
    for tree in stream {
        match tree {
            TokenTree::Ident(ident) => {
                let text = ident.to_string();
                let atom = match text.as_str() {
                    "impl" | "dyn" | "mut" | "in" | "where" | "for" | "as" => Atom::Keyword,
                    _ => Atom::Word,
                };
                out.push((atom, text));
            }
            TokenTree::Literal(literal) => out.push((Atom::Literal, literal.to_string())),
            TokenTree::Punct(punct) => {
                out.push((
                    Atom::Punct(punct.as_char(), punct.spacing()),
                    punct.as_char().to_string(),
                ));
            }
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ('(', ')'),
                    Delimiter::Bracket => ('[', ']'),
                    Delimiter::Brace => ('{', '}'),
                    Delimiter::None => {
                        flatten(group.stream(), out);
                        continue;
                    }
                };
                out.push((Atom::Open(open), open.to_string()));
                flatten(group.stream(), out);
                out.push((Atom::Close(close), close.to_string()));
            }
        }
    }
}

fn join(atoms: &[(Atom, String)]) -> String {
    // Trailing commas (`(a, b,)`, `where T: A,`) depend on line breaks: drop them.
    let atoms: Vec<(Atom, String)> = atoms
        .iter()
        .enumerate()
        .filter(|(i, (atom, _))| {
            !(matches!(atom, Atom::Punct(',', _))
                && matches!(atoms.get(i + 1), None | Some((Atom::Close(_), _))))
        })
        .map(|(_, a)| a.clone())
        .collect();
    let atoms = &atoms[..];
    let mut line = String::new();
    for (i, (atom, text)) in atoms.iter().enumerate() {
        if i > 0 && space_between(atoms, i) {
            line.push(' ');
        }
        // `{ a, b }`: a space inside braces.
        if let Atom::Close('}') = atom
            && !matches!(atoms[i - 1].0, Atom::Open('{'))
        {
            line.push(' ');
        }
        line.push_str(text);
        if let Atom::Open('{') = atom
            && !matches!(atoms.get(i + 1), Some((Atom::Close('}'), _)))
        {
            line.push(' ');
        }
    }
    line
}

/// Whether the punct at `i` is the second character of `::`, `->`, `=>` or of a
/// lifetime's quote.
fn joined_to_previous(atoms: &[(Atom, String)], i: usize) -> bool {
    i > 0 && matches!(atoms[i - 1].0, Atom::Punct(_, Spacing::Joint))
}

fn space_between(atoms: &[(Atom, String)], i: usize) -> bool {
    let prev = atoms[i - 1].0;
    let cur = atoms[i].0;
    // The characters of a joint punct (`::`, `->`, `'a`) stay together.
    if let Atom::Punct(_, Spacing::Joint) = prev {
        return false;
    }
    // After an opening delimiter, never (braces add their own space).
    if let Atom::Open(_) = prev {
        return false;
    }
    // After `&`, `<`, `!`, `#`, `?`, `*`: nothing (`&self`, `Vec<T>`, `?Sized`).
    if let Atom::Punct(c, Spacing::Alone) = prev {
        let is_path =
            c == ':' && i >= 2 && matches!(atoms[i - 2].0, Atom::Punct(':', Spacing::Joint));
        if is_path || matches!(c, '&' | '<' | '!' | '#' | '?' | '*' | '\'') {
            return false;
        }
        // `>` closing generics is followed by a space only before words (`impl<T> Foo`).
        if c == '>' && !joined_to_previous(atoms, i - 1) {
            return matches!(
                cur,
                Atom::Word | Atom::Keyword | Atom::Punct('=' | '+', _) | Atom::Open('{')
            );
        }
    }
    match cur {
        Atom::Close(_) => false,
        Atom::Punct(c, _) => match c {
            // `a::b`, `a: B`, `Vec<T>`: nothing before.
            ',' | ';' | '.' | ':' | '>' => false,
            // `FromRow<'r, <T as X>::Row>`.
            '<' => matches!(prev, Atom::Punct(',', _)),
            // `T: ?Sized`, `Send + ?Sized`.
            '?' => matches!(prev, Atom::Punct(':' | '+', Spacing::Alone)),
            '-' | '=' | '+' => true,
            '&' | '*' | '\'' | '!' | '#' => !matches!(prev, Atom::Punct('&' | '<', _)),
            _ => true,
        },
        Atom::Open('(') | Atom::Open('[') => match prev {
            Atom::Word | Atom::Close(_) => false,
            // `Vec<T>(…)` never occurs in a signature; `-> (A, B)` does.
            Atom::Punct('>', _) => joined_to_previous(atoms, i - 1),
            _ => true,
        },
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::tokens;

    fn sig(src: &str) -> String {
        let sig: syn::Signature = syn::parse_str(src).unwrap();
        tokens(&sig)
    }

    #[test]
    fn signatures_read_like_code() {
        assert_eq!(
            sig("async fn lock(&self, key: impl Into<LockKey>) -> Result<LockGuard>"),
            "async fn lock(&self, key: impl Into<LockKey>) -> Result<LockGuard>"
        );
        assert_eq!(
            sig(
                "fn f<'a, T: ?Sized + Send>(x: &'a mut [u8; 4], y: crate::a::B<T>) -> (u8, Vec<&'static str>) where T: Clone"
            ),
            "fn f<'a, T: ?Sized + Send>(x: &'a mut [u8; 4], y: crate::a::B<T>) -> (u8, Vec<&'static str>) where T: Clone"
        );
        assert_eq!(
            sig(
                "fn with<F, Fut>(work: F) -> Pin<Box<dyn Future<Output = T> + Send + 'static>> where F: FnOnce(LockInfo) -> Fut"
            ),
            "fn with<F, Fut>(work: F) -> Pin<Box<dyn Future<Output = T> + Send + 'static>> where F: FnOnce(LockInfo) -> Fut"
        );
    }
}
