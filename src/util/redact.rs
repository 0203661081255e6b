//! A URL as messages and `Debug` output show it, for every backend: never its credentials.

/// The URL for messages and `Debug`: credentials and the query (which may carry `pass=`) are
/// replaced by `<redacted>`; bounded and escaped.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("<not a URL, {} bytes>", url.len());
    };
    let scheme_ok = !scheme.is_empty()
        && scheme.len() <= 16
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let mut out = if scheme_ok {
        format!("{scheme}://")
    } else {
        "<scheme>://".to_string()
    };
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (rest, None),
    };
    let (before_query, query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    // The last `@`: a password with an unescaped `@` or `/` is still all redacted.
    let host_path = match before_query.rsplit_once('@') {
        Some((_, host_path)) => {
            out.push_str("<redacted>@");
            host_path
        }
        None => before_query,
    };
    out.push_str(host_path);
    if query.is_some() {
        out.push_str("?<redacted>");
    }
    match fragment {
        Some("insecure") => out.push_str("#insecure"),
        Some(_) => out.push_str("#<fragment>"),
        None => {}
    }
    let mut bounded = String::new();
    for (i, c) in out.chars().enumerate() {
        if i == 200 {
            bounded.push('…');
            break;
        }
        bounded.extend(c.escape_debug());
    }
    bounded
}
