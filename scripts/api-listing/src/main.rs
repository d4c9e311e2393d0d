//! Lists every public item of the lockflight crate, with all its features, from
//! its source: the items reachable through `pub mod` and `pub use` from
//! `src/lib.rs`, the `pub` methods, fields and constants of their inherent impls
//! (including those a crate-local `macro_rules!` writes into an impl), the items
//! of public traits, enum variants, and the trait impls of public types.
//!
//! `api-listing [CRATE_DIR]` prints the listing; `scripts/public-api` compares it
//! with `api/lockflight.txt`. Reading the source (with `syn`) rather than rustdoc's
//! output keeps the listing the same on every toolchain, stable or not.
//!
//! `#[cfg]` is evaluated as for `--all-features` outside tests: `feature = …` is
//! true, `test`, `doctest` and `docsrs` are false. The items that are public only
//! with the feature `unstable-backend-api` (outside semver) are listed too, marked
//! `[unstable]`, and counted apart.

mod print;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use proc_macro2::{TokenStream, TokenTree};
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, ImplItem, Item, Meta, Visibility};

use crate::print::tokens;

/// The feature whose items are public but outside semver.
const UNSTABLE: &str = "unstable-backend-api";

/// Whether `#[cfg]` evaluates [`UNSTABLE`] as off (every other feature is on).
static WITHOUT_UNSTABLE: AtomicBool = AtomicBool::new(false);

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let lib = Path::new(&dir).join("src/lib.rs");
    WITHOUT_UNSTABLE.store(true, Ordering::Relaxed);
    let stable = Crate::load(lib.clone());
    let stable: BTreeSet<String> = stable
        .public_paths("lockflight")
        .into_iter()
        .filter(|(target, _)| matches!(target, Target::Item(..)))
        .flat_map(|(_, paths)| paths)
        .collect();
    WITHOUT_UNSTABLE.store(false, Ordering::Relaxed);
    let krate = Crate::load(lib);
    print!("{}", krate.listing("lockflight", &stable));
}

/// One module of the crate: where it sits and its items (cfg already applied).
struct Module {
    name: String,
    parent: Option<usize>,
    items: Vec<Item>,
}

/// Something a path names inside the crate.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    Module(usize),
    /// `(module, index of the item in it)`.
    Item(usize, usize),
}

struct Crate {
    modules: Vec<Module>,
    macros: HashMap<String, syn::ItemMacro>,
}

impl Crate {
    fn load(lib: PathBuf) -> Crate {
        let mut krate = Crate {
            modules: Vec::new(),
            macros: HashMap::new(),
        };
        let file = parse_file(&lib);
        let dir = lib.parent().unwrap().to_path_buf();
        krate.add_module("crate".into(), None, file.items, dir);
        krate
    }

    /// Adds a module whose child files live in `dir`.
    fn add_module(&mut self, name: String, parent: Option<usize>, items: Vec<Item>, dir: PathBuf) {
        let index = self.modules.len();
        self.modules.push(Module {
            name,
            parent,
            items: Vec::new(),
        });
        let mut kept = Vec::new();
        for item in items {
            if !cfg_enabled(item_attrs(&item)) {
                continue;
            }
            if let Item::Macro(mac) = &item
                && let Some(ident) = &mac.ident
            {
                self.macros.insert(ident.to_string(), mac.clone());
            }
            kept.push(item);
        }
        for item in &kept {
            if let Item::Mod(module) = item {
                let name = module.ident.to_string();
                let (items, child_dir) = match &module.content {
                    Some((_, items)) => (items.clone(), dir.join(&name)),
                    None => {
                        let flat = dir.join(format!("{name}.rs"));
                        let nested = dir.join(&name).join("mod.rs");
                        let file = if flat.exists() { flat } else { nested };
                        (parse_file(&file).items, dir.join(&name))
                    }
                };
                self.add_module(name, Some(index), items, child_dir);
            }
        }
        self.modules[index].items = kept;
    }

    fn children(&self, module: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.modules.len()).filter(move |&m| self.modules[m].parent == Some(module))
    }

    /// What `name` means in `module`: its child modules, its items, its imports.
    fn lookup(&self, module: usize, name: &str, depth: usize) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        if let Some(child) = self
            .children(module)
            .find(|&m| self.modules[m].name == name)
        {
            return Some(Target::Module(child));
        }
        for (i, item) in self.modules[module].items.iter().enumerate() {
            if item_name(item).as_deref() == Some(name) && !matches!(item, Item::Mod(_)) {
                return Some(Target::Item(module, i));
            }
        }
        for item in &self.modules[module].items {
            if let Item::Use(use_item) = item {
                for import in flatten_use(&use_item.tree) {
                    if import.glob {
                        if let Some(Target::Module(m)) =
                            self.resolve(module, &import.path, depth + 1)
                            && let Some(found) = self.lookup(m, name, depth + 1)
                        {
                            return Some(found);
                        }
                    } else if import.alias == name {
                        return self.resolve(module, &import.path, depth + 1);
                    }
                }
            }
        }
        None
    }

    /// The target of a path written in `module`, or `None` outside the crate.
    fn resolve(&self, module: usize, path: &[String], depth: usize) -> Option<Target> {
        let mut current = Target::Module(module);
        for (i, segment) in path.iter().enumerate() {
            let Target::Module(m) = current else {
                return None;
            };
            current = match segment.as_str() {
                "crate" if i == 0 => Target::Module(0),
                "self" if i == 0 => Target::Module(m),
                "super" => Target::Module(self.modules[m].parent?),
                _ if i == 0 => self.lookup(m, segment, depth)?,
                _ => self.lookup_declared(m, segment, depth)?,
            };
        }
        Some(current)
    }

    /// Like [`lookup`](Self::lookup), for a path segment after the first.
    fn lookup_declared(&self, module: usize, name: &str, depth: usize) -> Option<Target> {
        self.lookup(module, name, depth)
    }

    /// Every public path of every item, from the crate root.
    fn public_paths(&self, root: &str) -> BTreeMap<Target, Vec<String>> {
        self.public_paths_and_foreign(root).0
    }

    /// [`public_paths`](Self::public_paths), and the re-exports of what lives
    /// outside the crate (a dependency re-exported whole, or an item of one), as
    /// `pub use PATH = FOREIGN` lines.
    fn public_paths_and_foreign(
        &self,
        root: &str,
    ) -> (BTreeMap<Target, Vec<String>>, BTreeSet<String>) {
        let mut paths: BTreeMap<Target, Vec<String>> = BTreeMap::new();
        let mut visited = BTreeSet::new();
        let mut foreign = BTreeSet::new();
        self.visit(0, root.to_string(), &mut paths, &mut visited, &mut foreign);
        for list in paths.values_mut() {
            list.sort_by_key(|p| (p.matches("::").count(), p.clone()));
            list.dedup();
        }
        (paths, foreign)
    }

    fn visit(
        &self,
        module: usize,
        path: String,
        paths: &mut BTreeMap<Target, Vec<String>>,
        visited: &mut BTreeSet<(usize, String)>,
        foreign: &mut BTreeSet<String>,
    ) {
        if !visited.insert((module, path.clone())) {
            return;
        }
        paths
            .entry(Target::Module(module))
            .or_default()
            .push(path.clone());
        for (i, item) in self.modules[module].items.iter().enumerate() {
            match item {
                Item::Mod(child) if is_pub(&child.vis) => {
                    let name = child.ident.to_string();
                    let m = self
                        .children(module)
                        .find(|&m| self.modules[m].name == name)
                        .unwrap();
                    self.visit(m, format!("{path}::{name}"), paths, visited, foreign);
                }
                Item::Use(use_item) if is_pub(&use_item.vis) => {
                    for import in flatten_use(&use_item.tree) {
                        assert!(
                            !import.glob,
                            "a public glob re-export in {path}: list it by name"
                        );
                        let at = format!("{path}::{}", import.alias);
                        match self.resolve(module, &import.path, 0) {
                            Some(Target::Module(m)) => self.visit(m, at, paths, visited, foreign),
                            Some(target) => paths.entry(target).or_default().push(at),
                            None => {
                                foreign.insert(format!(
                                    "pub use {at} = {} (another crate)",
                                    import.path.join("::")
                                ));
                            }
                        }
                    }
                }
                _ => {
                    if item_vis(item).is_some_and(is_pub)
                        && !matches!(item, Item::Impl(_))
                        && let Some(name) = item_name(item)
                    {
                        paths
                            .entry(Target::Item(module, i))
                            .or_default()
                            .push(format!("{path}::{name}"));
                    }
                }
            }
        }
    }

    fn item(&self, target: Target) -> Option<&Item> {
        match target {
            Target::Item(m, i) => Some(&self.modules[m].items[i]),
            Target::Module(_) => None,
        }
    }

    /// The crate-local item a type written in `module` names.
    fn resolve_type(&self, module: usize, ty: &syn::Type) -> Option<Target> {
        let syn::Type::Path(path) = ty else {
            return None;
        };
        if path.qself.is_some() {
            return None;
        }
        let segments: Vec<String> = path
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        self.resolve(module, &segments, 0)
    }

    /// The items of the impls a crate-local macro writes.
    fn expand(&self, mac: &syn::Macro, out: &mut Vec<ImplItem>) {
        let name = mac.path.segments.last().unwrap().ident.to_string();
        let Some(def) = self.macros.get(&name) else {
            eprintln!("api-listing: no crate-local macro {name}!, its items are not listed");
            return;
        };
        let Some(body) = expand_rules(&def.mac.tokens, &mac.tokens) else {
            eprintln!("api-listing: no rule of {name}! matches {}", mac.tokens);
            return;
        };
        let items = (|input: ParseStream| {
            let mut items = Vec::new();
            while !input.is_empty() {
                items.push(input.parse::<ImplItem>()?);
            }
            Ok(items)
        })
        .parse2(body)
        .expect("a macro's body parses as impl items");
        for item in items {
            match item {
                ImplItem::Macro(inner) => self.expand(&inner.mac, out),
                other => out.push(other),
            }
        }
    }

    /// The listing; an item with no path in `stable` is marked `[unstable]`.
    fn listing(&self, root: &str, stable: &BTreeSet<String>) -> String {
        let (paths, foreign) = self.public_paths_and_foreign(root);
        let canonical = |target: Target| paths.get(&target).map(|p| p[0].clone());
        // The entries of each public item, keyed by its canonical path.
        let mut entries: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut counts = Counts::default();
        for (&target, list) in &paths {
            let path = &list[0];
            let mut lines = Vec::new();
            match self.item(target) {
                None => lines.push(format!("pub mod {path}")),
                Some(item) if !list.iter().any(|p| stable.contains(p)) => {
                    lines.push(format!("[unstable] {}", header(item, path)));
                    counts.count_unstable(item);
                    lines.extend(fields(item, path));
                }
                Some(item) => {
                    lines.push(header(item, path));
                    counts.count(item);
                    lines.extend(fields(item, path));
                }
            }
            for alias in &list[1..] {
                lines.push(format!("pub use {alias} = {path}"));
            }
            entries.insert(path.clone(), lines);
        }
        // Inherent and trait impls, wherever they are written.
        for (m, module) in self.modules.iter().enumerate() {
            for item in &module.items {
                let Item::Impl(imp) = item else { continue };
                let self_path = self.resolve_type(m, &imp.self_ty).and_then(canonical);
                match &imp.trait_ {
                    None => {
                        let Some(self_path) = self_path else { continue };
                        let mut items = Vec::new();
                        for impl_item in &imp.items {
                            match impl_item {
                                ImplItem::Macro(mac) => self.expand(&mac.mac, &mut items),
                                other => items.push(other.clone()),
                            }
                        }
                        let set = members.entry(self_path.clone()).or_default();
                        for impl_item in items {
                            if let Some(line) = inherent_member(&impl_item, &self_path, imp) {
                                if self_path.ends_with("::Locker") && line.contains(" fn ") {
                                    counts.locker_methods += 1;
                                }
                                set.insert(line);
                            }
                        }
                    }
                    Some((negative, trait_path, _)) => {
                        let segments: Vec<String> = trait_path
                            .segments
                            .iter()
                            .map(|s| s.ident.to_string())
                            .collect();
                        let trait_canon = self.resolve(m, &segments, 0).and_then(canonical);
                        let owner = match (&self_path, &trait_canon) {
                            (Some(owner), _) | (None, Some(owner)) => owner.clone(),
                            (None, None) => continue,
                        };
                        let generics = &imp.generics;
                        let mut trait_text = tokens(trait_path);
                        if let Some(canon) = &trait_canon {
                            let last = tokens(&trait_path.segments.last().unwrap().arguments);
                            trait_text = format!("{canon}{last}");
                        }
                        let self_text = match &self_path {
                            Some(canon) => {
                                let syn::Type::Path(p) = &*imp.self_ty else {
                                    unreachable!()
                                };
                                format!(
                                    "{canon}{}",
                                    tokens(&p.path.segments.last().unwrap().arguments)
                                )
                            }
                            None => tokens(&imp.self_ty),
                        };
                        let bang = if negative.is_some() { "!" } else { "" };
                        let mut line = format!(
                            "impl{} {bang}{trait_text} for {self_text}",
                            tokens(generics)
                        );
                        if let Some(clause) = &generics.where_clause {
                            write!(line, " {}", tokens(clause)).unwrap();
                        }
                        members.entry(owner).or_default().insert(line);
                    }
                }
            }
        }
        // Derived traits are impls too.
        for (&target, list) in &paths {
            if let Some(item) = self.item(target) {
                for derived in derives(item) {
                    members
                        .entry(list[0].clone())
                        .or_default()
                        .insert(format!("impl {derived} for {}", list[0]));
                }
            }
        }
        let mut out = String::new();
        writeln!(
            out,
            "# The public API of lockflight with all features: one line per item, method,\n\
             # field, variant and trait impl. Generated by `scripts/public-api --bless`;\n\
             # `scripts/public-api` (run by scripts/test) fails when the code differs.\n\
             # public types (struct, enum, type alias, trait): {}; methods on Locker: {}\n\
             # [unstable]: public only with the feature `{UNSTABLE}`, outside semver: {} types\n",
            counts.types, counts.locker_methods, counts.unstable_types
        )
        .unwrap();
        for (path, lines) in &entries {
            for line in lines {
                writeln!(out, "{line}").unwrap();
            }
            for member in members.get(path).into_iter().flatten() {
                writeln!(out, "{member}").unwrap();
            }
        }
        // Other crates re-exported: part of the API (a major bump of one is a
        // breaking release; ARCHITECTURE.md, "Public dependencies").
        for line in &foreign {
            writeln!(out, "{line}").unwrap();
        }
        out
    }
}

#[derive(Default)]
struct Counts {
    types: usize,
    unstable_types: usize,
    locker_methods: usize,
}

impl Counts {
    fn count(&mut self, item: &Item) {
        if is_type(item) {
            self.types += 1;
        }
    }

    fn count_unstable(&mut self, item: &Item) {
        if is_type(item) {
            self.unstable_types += 1;
        }
    }
}

fn is_type(item: &Item) -> bool {
    matches!(
        item,
        Item::Struct(_) | Item::Enum(_) | Item::Union(_) | Item::Type(_) | Item::Trait(_)
    )
}

/// The line that names a public item: its kind, path and generics.
fn header(item: &Item, path: &str) -> String {
    let attrs = item_attrs(item);
    let mut line = String::new();
    if attrs.iter().any(|a| a.path().is_ident("non_exhaustive")) {
        line.push_str("#[non_exhaustive] ");
    }
    if is_doc_hidden(attrs) {
        line.push_str("#[doc(hidden)] ");
    }
    let rest = match item {
        Item::Struct(s) => format!("pub struct {path}{}", generics_and_where(&s.generics)),
        Item::Enum(e) => format!("pub enum {path}{}", generics_and_where(&e.generics)),
        Item::Union(u) => format!("pub union {path}{}", generics_and_where(&u.generics)),
        Item::Trait(t) => {
            let bounds = if t.supertraits.is_empty() {
                String::new()
            } else {
                format!(": {}", tokens(&t.supertraits))
            };
            let unsafety = if t.unsafety.is_some() { "unsafe " } else { "" };
            format!(
                "pub {unsafety}trait {path}{}{bounds}{}",
                tokens(&t.generics),
                where_clause(&t.generics)
            )
        }
        Item::Type(t) => format!("pub type {path}{} = {}", tokens(&t.generics), tokens(&t.ty)),
        Item::Fn(f) => format!("pub {}", signature(&f.sig, path)),
        Item::Const(c) => format!("pub const {path}: {}", tokens(&c.ty)),
        Item::Static(s) => format!("pub static {path}: {}", tokens(&s.ty)),
        Item::Macro(_) => format!("macro {path}!"),
        _ => format!("pub item {path}"),
    };
    line.push_str(&rest);
    line
}

/// Public fields, enum variants, trait items.
fn fields(item: &Item, path: &str) -> Vec<String> {
    let mut lines = Vec::new();
    match item {
        Item::Struct(s) => lines.extend(pub_fields(&s.fields, path)),
        Item::Enum(e) => {
            for variant in &e.variants {
                if !cfg_enabled(&variant.attrs) {
                    continue;
                }
                let shape = match &variant.fields {
                    syn::Fields::Named(named) => {
                        let names: Vec<String> = named
                            .named
                            .iter()
                            .map(|f| format!("{}: {}", f.ident.as_ref().unwrap(), tokens(&f.ty)))
                            .collect();
                        format!(" {{ {} }}", names.join(", "))
                    }
                    syn::Fields::Unnamed(unnamed) => {
                        let types: Vec<String> =
                            unnamed.unnamed.iter().map(|f| tokens(&f.ty)).collect();
                        format!("({})", types.join(", "))
                    }
                    syn::Fields::Unit => String::new(),
                };
                lines.push(format!("{path}::{}{shape}", variant.ident));
            }
        }
        Item::Trait(t) => {
            for trait_item in &t.items {
                match trait_item {
                    syn::TraitItem::Fn(f) if cfg_enabled(&f.attrs) => {
                        let hidden = if is_doc_hidden(&f.attrs) {
                            "#[doc(hidden)] "
                        } else {
                            ""
                        };
                        let provided = if f.default.is_some() {
                            " (provided)"
                        } else {
                            ""
                        };
                        lines.push(format!(
                            "{hidden}{}{provided}",
                            signature(&f.sig, &format!("{path}::{}", f.sig.ident))
                        ));
                    }
                    syn::TraitItem::Type(t) if cfg_enabled(&t.attrs) => {
                        let bounds = if t.bounds.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", tokens(&t.bounds))
                        };
                        lines.push(format!(
                            "type {path}::{}{}{bounds}",
                            t.ident,
                            tokens(&t.generics)
                        ));
                    }
                    syn::TraitItem::Const(c) if cfg_enabled(&c.attrs) => {
                        lines.push(format!("const {path}::{}: {}", c.ident, tokens(&c.ty)));
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    lines
}

fn pub_fields(fields: &syn::Fields, path: &str) -> Vec<String> {
    fields
        .iter()
        .enumerate()
        .filter(|(_, f)| is_pub(&f.vis) && cfg_enabled(&f.attrs))
        .map(|(i, f)| {
            let name = f.ident.as_ref().map_or(i.to_string(), |n| n.to_string());
            format!("pub {path}.{name}: {}", tokens(&f.ty))
        })
        .collect()
}

/// A `pub` method or constant of an inherent impl, as a line.
fn inherent_member(item: &ImplItem, self_path: &str, imp: &syn::ItemImpl) -> Option<String> {
    let generics = if imp.generics.params.is_empty() {
        String::new()
    } else {
        format!(" (impl{})", tokens(&imp.generics))
    };
    match item {
        ImplItem::Fn(f) if is_pub(&f.vis) && cfg_enabled(&f.attrs) => {
            let hidden = if is_doc_hidden(&f.attrs) {
                "#[doc(hidden)] "
            } else {
                ""
            };
            let path = format!("{self_path}::{}", f.sig.ident);
            Some(format!(
                "{hidden}pub {}{generics}",
                signature(&f.sig, &path)
            ))
        }
        ImplItem::Const(c) if is_pub(&c.vis) && cfg_enabled(&c.attrs) => Some(format!(
            "pub const {self_path}::{}: {}",
            c.ident,
            tokens(&c.ty)
        )),
        _ => None,
    }
}

/// `async fn path<T>(args) -> Out where …`.
fn signature(sig: &syn::Signature, path: &str) -> String {
    let mut line = String::new();
    if sig.constness.is_some() {
        line.push_str("const ");
    }
    if sig.asyncness.is_some() {
        line.push_str("async ");
    }
    if sig.unsafety.is_some() {
        line.push_str("unsafe ");
    }
    write!(
        line,
        "fn {path}{}({})",
        tokens(&sig.generics),
        tokens(&sig.inputs)
    )
    .unwrap();
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        write!(line, " -> {}", tokens(ty)).unwrap();
    }
    line.push_str(&where_clause(&sig.generics));
    line
}

fn generics_and_where(generics: &syn::Generics) -> String {
    format!("{}{}", tokens(generics), where_clause(generics))
}

fn where_clause(generics: &syn::Generics) -> String {
    generics
        .where_clause
        .as_ref()
        .map_or(String::new(), |w| format!(" {}", tokens(w)))
}

/// The traits of `#[derive(…)]`.
fn derives(item: &Item) -> Vec<String> {
    let mut out = Vec::new();
    for attr in item_attrs(item) {
        if attr.path().is_ident("derive") {
            let _ = attr.parse_nested_meta(|meta| {
                out.push(tokens(&meta.path));
                Ok(())
            });
        }
    }
    out
}

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

fn is_doc_hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("doc")
            && matches!(&a.meta, Meta::List(list) if list.tokens.to_string().trim() == "hidden")
    })
}

/// Whether `#[cfg]` keeps the item with all features, outside tests.
fn cfg_enabled(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .all(|a| match &a.meta {
            Meta::List(list) => {
                eval_cfg(&syn::parse2::<Meta>(list.tokens.clone()).expect("a cfg predicate"))
            }
            _ => true,
        })
}

fn eval_cfg(meta: &Meta) -> bool {
    let nested = |list: &syn::MetaList| -> Vec<bool> {
        list.parse_args_with(syn::punctuated::Punctuated::<Meta, syn::Token![,]>::parse_terminated)
            .expect("cfg arguments")
            .iter()
            .map(eval_cfg)
            .collect()
    };
    match meta {
        Meta::Path(path) => {
            let name = tokens(path);
            !matches!(
                name.as_str(),
                "test" | "doctest" | "docsrs" | "miri" | "loom" | "windows"
            )
        }
        Meta::NameValue(nv) => {
            let key = tokens(&nv.path);
            let value = tokens(&nv.value);
            match key.as_str() {
                "feature" => {
                    !(WITHOUT_UNSTABLE.load(Ordering::Relaxed)
                        && value == format!("\"{UNSTABLE}\""))
                }
                "target_os" => value == "\"linux\"",
                "target_family" => value == "\"unix\"",
                _ => true,
            }
        }
        Meta::List(list) => {
            let name = tokens(&list.path);
            let values = nested(list);
            match name.as_str() {
                "all" => values.iter().all(|&v| v),
                "any" => values.iter().any(|&v| v),
                "not" => !values[0],
                other => panic!("unknown cfg predicate {other}"),
            }
        }
    }
}

fn parse_file(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_vis(item: &Item) -> Option<&Visibility> {
    Some(match item {
        Item::Const(i) => &i.vis,
        Item::Enum(i) => &i.vis,
        Item::Fn(i) => &i.vis,
        Item::Mod(i) => &i.vis,
        Item::Static(i) => &i.vis,
        Item::Struct(i) => &i.vis,
        Item::Trait(i) => &i.vis,
        Item::TraitAlias(i) => &i.vis,
        Item::Type(i) => &i.vis,
        Item::Union(i) => &i.vis,
        Item::Use(i) => &i.vis,
        _ => return None,
    })
}

fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Mod(i) => &i.ident,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// One name a `use` brings in: `alias` for `path` (or every name of `path` for a glob).
struct Import {
    path: Vec<String>,
    alias: String,
    glob: bool,
}

fn flatten_use(tree: &syn::UseTree) -> Vec<Import> {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Import>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    out.push(Import {
                        path: prefix.clone(),
                        alias: prefix.last().cloned().unwrap_or_default(),
                        glob: false,
                    });
                } else {
                    let mut path = prefix.clone();
                    path.push(name.clone());
                    out.push(Import {
                        path,
                        alias: name,
                        glob: false,
                    });
                }
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                out.push(Import {
                    path,
                    alias: r.rename.to_string(),
                    glob: false,
                });
            }
            syn::UseTree::Glob(_) => out.push(Import {
                path: prefix.clone(),
                alias: String::new(),
                glob: true,
            }),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    walk(tree, prefix, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// The body of the first rule of a `macro_rules!` whose matcher takes `input`, with
/// its metavariables and `$crate` replaced. Enough for macros whose fragments are
/// single token trees (`$x:literal`, `$x:ident`, `$x:tt`).
fn expand_rules(rules: &TokenStream, input: &TokenStream) -> Option<TokenStream> {
    let trees: Vec<TokenTree> = rules.clone().into_iter().collect();
    let mut i = 0;
    while i + 2 < trees.len() {
        let (TokenTree::Group(matcher), TokenTree::Group(body)) = (&trees[i], &trees[i + 3]) else {
            return None;
        };
        if let Some(bindings) = match_rule(matcher.stream(), input.clone()) {
            return Some(substitute(body.stream(), &bindings));
        }
        i += 5; // matcher, `=`, `>`, body, `;`
    }
    None
}

fn match_rule(matcher: TokenStream, input: TokenStream) -> Option<HashMap<String, TokenTree>> {
    let pattern: Vec<TokenTree> = matcher.into_iter().collect();
    let input: Vec<TokenTree> = input.into_iter().collect();
    let mut bindings = HashMap::new();
    let (mut p, mut i) = (0, 0);
    while p < pattern.len() {
        match &pattern[p] {
            TokenTree::Punct(dollar) if dollar.as_char() == '$' => {
                let TokenTree::Ident(name) = &pattern[p + 1] else {
                    return None;
                };
                bindings.insert(name.to_string(), input.get(i)?.clone());
                p += 4; // `$`, name, `:`, fragment
                i += 1;
            }
            expected => {
                if expected.to_string() != input.get(i)?.to_string() {
                    return None;
                }
                p += 1;
                i += 1;
            }
        }
    }
    (i == input.len()).then_some(bindings)
}

fn substitute(body: TokenStream, bindings: &HashMap<String, TokenTree>) -> TokenStream {
    let trees: Vec<TokenTree> = body.into_iter().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Punct(dollar) if dollar.as_char() == '$' => {
                if let Some(TokenTree::Ident(name)) = trees.get(i + 1) {
                    let name = name.to_string();
                    if name == "crate" {
                        out.push(TokenTree::Ident(proc_macro2::Ident::new(
                            "crate",
                            dollar.span(),
                        )));
                    } else if let Some(bound) = bindings.get(&name) {
                        out.push(bound.clone());
                    }
                    i += 2;
                    continue;
                }
                out.push(trees[i].clone());
            }
            TokenTree::Group(group) => {
                let mut new = proc_macro2::Group::new(
                    group.delimiter(),
                    substitute(group.stream(), bindings),
                );
                new.set_span(group.span());
                out.push(TokenTree::Group(new));
            }
            other => out.push(other.clone()),
        }
        i += 1;
    }
    out.into_iter().collect()
}
