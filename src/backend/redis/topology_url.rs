//! The URL forms a user types for a deployment, parsed into a [`Target`] before any network
//! I/O: a single server, the seed nodes of a Redis Cluster, or a Sentinel-monitored primary.
//!
//! | form | result |
//! |------|--------|
//! | `redis://…`, `rediss://…`, `unix://…` | [`Target::Single`], the URL unchanged ([`super::url::check_url`] validates it) |
//! | `redis+cluster://[user:pass@]HOST[:PORT],HOST[:PORT]/[?query]` | [`Target::Cluster`], one plain `redis://[user:pass@]HOST:PORT/[?query]` per seed |
//! | `redis+sentinel://[user:pass@]HOST[:PORT],…/SERVICE[/DB][?query]` | [`Target::Sentinel`] |
//!
//! `rediss+cluster://` and `rediss+sentinel://` are the same over TLS (feature `tls`); every
//! URL built from them (seeds, Sentinels, the primary) is `rediss://`.
//!
//! A host is a name, an IPv4 address or a bracketed IPv6 address (`[::1]:6379`). A missing port
//! is 6379 for cluster seeds and data nodes and 26379 for Sentinels.
//!
//! **Credentials and the query belong to the data nodes.** In a Sentinel URL, `user:pass@` and
//! `?query` are carried to the primary's URL ([`DataTemplate::primary_url`]); the Sentinels are
//! contacted without credentials and without the query (baton does not support a password on
//! the Sentinels themselves). In a cluster URL they are carried to every seed.
//!
//! Every error message shows the URL through [`redact_url`]: never a password.

use std::fmt;

use super::url::redact_url;
use crate::error::ConfigError;

/// The port of a Redis data node (a cluster seed, a primary) when the URL names none.
pub(crate) const DEFAULT_DATA_PORT: u16 = 6379;
/// The port of a Sentinel when the URL names none.
pub(crate) const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Where a URL says the data lives.
///
/// `Debug` shows every URL through [`redact_url`] (no credentials).
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server: the URL exactly as given (`redis://`, `rediss://` or `unix://`).
    Single(String),
    /// The seed nodes of a Redis Cluster, each a plain single-server URL
    /// (`redis[s]://[user:pass@]HOST:PORT/[?query]`), in the order given.
    Cluster {
        /// One URL per seed, carrying the credentials and the query.
        seeds: Vec<String>,
    },
    /// A primary found through Sentinels.
    Sentinel {
        /// One plain URL per Sentinel (`redis[s]://HOST:PORT/`), in the order given, without
        /// credentials or query.
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the primary under.
        service: String,
        /// How to reach the primary once a Sentinel named its address.
        data: DataTemplate,
    },
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>();
        match self {
            Target::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            Target::Cluster { seeds } => f
                .debug_struct("Cluster")
                .field("seeds", &redacted(seeds))
                .finish(),
            Target::Sentinel {
                sentinels,
                service,
                data,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", &redacted(sentinels))
                .field("service", service)
                .field("data", data)
                .finish(),
        }
    }
}

/// What a Sentinel URL says about the data nodes: scheme, credentials, db and query, everything
/// but the address (which the Sentinels tell). `Debug` never shows the credentials or the query.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct DataTemplate {
    /// `redis` or `rediss`.
    scheme: &'static str,
    /// `user:pass` (or `:pass`, `user`) exactly as typed (percent-encoding kept), without `@`.
    userinfo: Option<String>,
    db: u32,
    /// The query without `?`, exactly as typed.
    query: Option<String>,
}

impl fmt::Debug for DataTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataTemplate")
            .field("scheme", &self.scheme)
            .field("userinfo", &self.userinfo.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("query", &self.query.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl DataTemplate {
    /// The primary's URL, `redis[s]://[user:pass@]host:port/DB[?query]`, once a Sentinel named
    /// `host` and `port`. A bare IPv6 address (`::1`, as Sentinels report it) is bracketed.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn primary_url(&self, host: &str, port: u16) -> String {
        let mut url = format!("{}://", self.scheme);
        if let Some(userinfo) = &self.userinfo {
            url.push_str(userinfo);
            url.push('@');
        }
        if host.contains(':') && !host.starts_with('[') {
            url.push_str(&format!("[{host}]:{port}/{}", self.db));
        } else {
            url.push_str(&format!("{host}:{port}/{}", self.db));
        }
        if let Some(query) = &self.query {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// The database number the URL names (0 when it names none).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn db(&self) -> u32 {
        self.db
    }
}

/// Parses what the user typed into a [`Target`]; no network I/O.
///
/// # Errors
///
/// A [`ConfigError`] on field `url` (the URL redacted) for: an unknown scheme, `+cluster` /
/// `+sentinel` on a base other than `redis` / `rediss`, `rediss…` without the `tls` feature, a
/// fragment, empty credentials (`:@`), an empty host list or host, a bad port, a cluster URL
/// naming a db other than 0, a Sentinel URL without a service, a bad db number.
pub(crate) fn parse(url: &str) -> Result<Target, ConfigError> {
    let bad = |why: &str| ConfigError::invalid("url", format!("{}: {why}", redact_url(url)));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(&format!(
            "not a URL (expected {})",
            super::url::compiled_schemes()
        )));
    };
    if matches!(scheme, "redis" | "rediss" | "unix") {
        return Ok(Target::Single(url.to_string()));
    }
    let Some((base, kind)) = scheme.split_once('+') else {
        return Err(bad(&format!(
            "the scheme must be {}",
            super::url::compiled_schemes()
        )));
    };
    let kind = match kind {
        "cluster" => Kind::Cluster,
        "sentinel" => Kind::Sentinel,
        _ => {
            return Err(bad(
                "after `+` the scheme must say `cluster` or `sentinel` (redis+cluster://, \
                 redis+sentinel://)",
            ))
        }
    };
    let base: &'static str = match base {
        "redis" => "redis",
        "rediss" if cfg!(feature = "tls") => "rediss",
        "rediss" => {
            return Err(bad(
                "rediss+… needs baton's `tls` feature, which is not compiled in",
            ))
        }
        _ => {
            return Err(bad(
                "+cluster and +sentinel go with redis or rediss only (redis+cluster://, \
                 rediss+sentinel://, …)",
            ))
        }
    };
    if let Some((_, fragment)) = rest.split_once('#') {
        return Err(if fragment == "insecure" {
            bad("#insecure (skip certificate checks) is always refused")
        } else {
            bad("a URL fragment is not allowed")
        });
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, (!q.is_empty()).then(|| q.to_string())),
        None => (rest, None),
    };
    // The last `@`, as in `redact_url`: a password with an unescaped `@` or `/` stays whole.
    let (userinfo, hosts_path) = match before_query.rsplit_once('@') {
        Some((userinfo, after)) => {
            if userinfo.is_empty() || userinfo == ":" {
                return Err(bad(
                    "empty credentials (`:@`): give a password, or leave out the `@`",
                ));
            }
            (Some(userinfo.to_string()), after)
        }
        None => (None, before_query),
    };
    let (hosts, path) = match hosts_path.split_once('/') {
        Some((hosts, path)) => (hosts, Some(path)),
        None => (hosts_path, None),
    };
    let default_port = match kind {
        Kind::Cluster => DEFAULT_DATA_PORT,
        Kind::Sentinel => DEFAULT_SENTINEL_PORT,
    };
    if hosts.is_empty() {
        return Err(bad("no host: list at least one HOST:PORT"));
    }
    let mut addrs = Vec::new();
    for (i, host) in hosts.split(',').enumerate() {
        let addr = host_port(host, default_port).map_err(|why| {
            bad(&format!(
                "host {} of the list: {why}",
                i + 1 // 1-based, as people count
            ))
        })?;
        addrs.push(addr);
    }
    match kind {
        Kind::Cluster => {
            match path {
                None | Some("") | Some("0") => {}
                Some(db) if parse_db(db).is_some() => {
                    return Err(bad(
                        "a Redis Cluster has only database 0; leave the db out of the URL",
                    ))
                }
                Some(_) => {
                    return Err(bad(
                        "after the host list a cluster URL takes nothing but `/` (or `/0`)",
                    ))
                }
            }
            let seeds = addrs
                .iter()
                .map(|(host, port)| {
                    let mut seed = format!("{base}://");
                    if let Some(userinfo) = &userinfo {
                        seed.push_str(userinfo);
                        seed.push('@');
                    }
                    seed.push_str(&format!("{host}:{port}/"));
                    if let Some(query) = &query {
                        seed.push('?');
                        seed.push_str(query);
                    }
                    seed
                })
                .collect();
            Ok(Target::Cluster { seeds })
        }
        Kind::Sentinel => {
            let path = path.unwrap_or("");
            let (service, db) = match path.split_once('/') {
                Some((service, db)) => (service, Some(db)),
                None => (path, None),
            };
            if service.is_empty() {
                return Err(bad(
                    "no service: a Sentinel URL ends in /SERVICE (the name the Sentinels monitor \
                     the primary under), optionally /SERVICE/DB",
                ));
            }
            if service.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad(
                    "the service name contains a space or a control character",
                ));
            }
            let db = match db {
                None | Some("") => 0,
                Some(db) => parse_db(db).ok_or_else(|| {
                    bad("the db after /SERVICE/ must be a number (0 to 4294967295)")
                })?,
            };
            let sentinels = addrs
                .iter()
                .map(|(host, port)| format!("{base}://{host}:{port}/"))
                .collect();
            Ok(Target::Sentinel {
                sentinels,
                service: service.to_string(),
                data: DataTemplate {
                    scheme: base,
                    userinfo,
                    db,
                    query,
                },
            })
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Cluster,
    Sentinel,
}

/// A database number: decimal digits only (no sign, no spaces).
fn parse_db(db: &str) -> Option<u32> {
    if db.is_empty() || !db.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    db.parse().ok()
}

/// One `HOST[:PORT]` of a host list: the host as it goes into a URL (IPv6 bracketed) and the
/// port. The error says why, without the URL (the caller adds it, redacted).
fn host_port(entry: &str, default_port: u16) -> Result<(String, u16), String> {
    if entry.is_empty() {
        return Err("empty (two commas in a row, or a comma at an end?)".into());
    }
    let (host, port) = if let Some(inner) = entry.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return Err("an IPv6 address opened with `[` is not closed with `]`".into());
        };
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err("not an IPv6 address between `[` and `]`".into());
        }
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err("after `]` only `:PORT` may follow".into()),
            },
        };
        (format!("[{addr}]"), port)
    } else {
        let (host, port) = match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        };
        if let Some(port) = port {
            if port.contains(':') {
                return Err("an IPv6 address needs brackets: [::1]:6379".into());
            }
        }
        if host.is_empty() {
            return Err("empty host name".into());
        }
        if host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '[' | ']'))
        {
            return Err("the host name contains a space, a control character or a bracket".into());
        }
        (host.to_string(), port)
    };
    let port = match port {
        None => default_port,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
            _ => return Err("the port must be a number from 1 to 65535".into()),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match parse(url) {
            Ok(t) => panic!("{url} was accepted as {t:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn sentinel(url: &str) -> (Vec<String>, String, DataTemplate) {
        match parse(url) {
            Ok(Target::Sentinel {
                sentinels,
                service,
                data,
            }) => (sentinels, service, data),
            other => panic!("{url}: {other:?}"),
        }
    }

    fn cluster(url: &str) -> Vec<String> {
        match parse(url) {
            Ok(Target::Cluster { seeds }) => seeds,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn single_server_urls_pass_through_unchanged() {
        for url in [
            "redis://127.0.0.1:6379/",
            "redis://u:p@h:1/2?protocol=resp3",
            "rediss://h/",
            "unix:///tmp/redis.sock",
            // Not validated here: check_url does that.
            "redis://",
        ] {
            assert_eq!(parse(url), Ok(Target::Single(url.to_string())), "{url}");
        }
    }

    #[test]
    fn cluster_seeds_become_plain_urls_with_credentials_and_query() {
        assert_eq!(
            cluster("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/"),
            ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7001/"]
        );
        assert_eq!(
            cluster("redis+cluster://user:s3cret@a:7000,b?protocol=resp3"),
            [
                "redis://user:s3cret@a:7000/?protocol=resp3",
                "redis://user:s3cret@b:6379/?protocol=resp3",
            ]
        );
        assert_eq!(cluster("redis+cluster://h:1/0"), ["redis://h:1/"]);
        assert_eq!(cluster("redis+cluster://h:1"), ["redis://h:1/"]);
    }

    #[test]
    fn a_cluster_url_refuses_a_db_other_than_0() {
        let e = err("redis+cluster://h:1,h:2/3");
        assert!(e.contains("only database 0"), "{e}");
        let e = err("redis+cluster://h:1/svc");
        assert!(e.contains("nothing but"), "{e}");
    }

    #[test]
    fn sentinel_urls_split_into_sentinels_service_and_the_data_template() {
        let (sentinels, service, data) =
            sentinel("redis+sentinel://127.0.0.1:26380,127.0.0.1:26381,host/baton-test");
        assert_eq!(
            sentinels,
            [
                "redis://127.0.0.1:26380/",
                "redis://127.0.0.1:26381/",
                "redis://host:26379/",
            ]
        );
        assert_eq!(service, "baton-test");
        assert_eq!(data.db(), 0);
        assert_eq!(
            data.primary_url("10.1.1.1", 6380),
            "redis://10.1.1.1:6380/0"
        );

        // Credentials and the query go to the primary, never to the Sentinels.
        let (sentinels, service, data) =
            sentinel("redis+sentinel://app:pw%40x@s1:1,s2:2/mymaster/3?protocol=resp3");
        assert_eq!(sentinels, ["redis://s1:1/", "redis://s2:2/"]);
        assert_eq!(service, "mymaster");
        assert_eq!(data.db(), 3);
        assert_eq!(
            data.primary_url("10.1.1.1", 6380),
            "redis://app:pw%40x@10.1.1.1:6380/3?protocol=resp3"
        );
        // A trailing `/` after the service is db 0.
        let (_, service, data) = sentinel("redis+sentinel://s/svc/");
        assert_eq!((service.as_str(), data.db()), ("svc", 0));
    }

    #[test]
    fn the_primary_url_brackets_a_bare_ipv6_address() {
        let (_, _, data) = sentinel("redis+sentinel://[::1]/svc");
        assert_eq!(data.primary_url("::1", 7000), "redis://[::1]:7000/0");
        assert_eq!(data.primary_url("[::1]", 7000), "redis://[::1]:7000/0");
    }

    #[test]
    fn ipv6_hosts_and_default_ports() {
        let (sentinels, _, _) = sentinel("redis+sentinel://[::1]:26380,[::1],[fe80::1:2]:1/svc");
        assert_eq!(
            sentinels,
            [
                "redis://[::1]:26380/",
                "redis://[::1]:26379/",
                "redis://[fe80::1:2]:1/",
            ]
        );
        assert_eq!(
            cluster("redis+cluster://[::1]:7000,[::1]"),
            ["redis://[::1]:7000/", "redis://[::1]:6379/"]
        );
    }

    #[test]
    fn bad_host_lists_are_refused() {
        for (url, why) in [
            ("redis+sentinel:///svc", "no host"),
            ("redis+cluster://", "no host"),
            ("redis+cluster://u:p@/", "no host"),
            ("redis+sentinel://a:1,,b:2/svc", "host 2 of the list: empty"),
            ("redis+sentinel://a:1,/svc", "host 2 of the list: empty"),
            ("redis+sentinel://:26379/svc", "empty host name"),
            ("redis+cluster://a:0", "port must be"),
            ("redis+cluster://a:65536", "port must be"),
            ("redis+cluster://a:", "port must be"),
            ("redis+cluster://a:+1", "port must be"),
            ("redis+cluster://a:x1", "port must be"),
            ("redis+cluster://::1:7000", "needs brackets"),
            ("redis+cluster://[::1:7000", "not closed"),
            ("redis+cluster://[]:7000", "not an IPv6 address"),
            ("redis+cluster://[::1]7000", "only `:PORT`"),
            ("redis+cluster://a b:1", "space"),
        ] {
            let e = err(url);
            assert!(e.contains(why), "{url}: {e}");
            assert!(e.starts_with("invalid `url`: "), "{url}: {e}");
        }
    }

    #[test]
    fn a_sentinel_url_needs_a_service_and_a_numeric_db() {
        for url in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1//0",
            "redis+sentinel://u:p@a:1/?x=y",
        ] {
            let e = err(url);
            assert!(e.contains("no service"), "{url}: {e}");
        }
        for url in [
            "redis+sentinel://a:1/svc/x",
            "redis+sentinel://a:1/svc/-1",
            "redis+sentinel://a:1/svc/1/2",
            "redis+sentinel://a:1/svc/99999999999",
        ] {
            let e = err(url);
            assert!(e.contains("must be a number"), "{url}: {e}");
        }
    }

    #[test]
    fn unknown_schemes_and_fragments_are_refused() {
        for (url, why) in [
            ("127.0.0.1:6379", "not a URL"),
            ("http://h:1/", "the scheme must be"),
            ("redis+replica://h:1/", "`cluster` or `sentinel`"),
            ("unix+sentinel://h:1/svc", "go with redis or rediss only"),
            ("valkey+cluster://h:1/", "go with redis or rediss only"),
            ("redis+sentinel://h:1/svc#frag", "fragment is not allowed"),
            ("redis+cluster://h:1/#insecure", "always refused"),
            ("redis+sentinel://:@h:1/svc", "empty credentials"),
            ("redis+cluster://@h:1/", "empty credentials"),
        ] {
            let e = err(url);
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_topologies_need_the_tls_feature() {
        for url in ["rediss+cluster://h:1/", "rediss+sentinel://h:1/svc"] {
            let e = err(url);
            assert!(e.contains("needs baton's `tls` feature"), "{url}: {e}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn rediss_topologies_build_rediss_urls() {
        assert_eq!(
            cluster("rediss+cluster://u:p@h:1,g:2/"),
            ["rediss://u:p@h:1/", "rediss://u:p@g:2/"]
        );
        let (sentinels, _, data) = sentinel("rediss+sentinel://u:p@h:1/svc/2");
        assert_eq!(sentinels, ["rediss://h:1/"]);
        assert_eq!(
            data.primary_url("10.0.0.9", 6379),
            "rediss://u:p@10.0.0.9:6379/2"
        );
    }

    #[test]
    fn no_error_and_no_debug_output_shows_a_password() {
        const PW: &str = "hunter2-secret";
        for url in [
            format!("redis+sentinel://user:{PW}@a:1,,b/svc"),
            format!("redis+sentinel://user:{PW}@a:1/"),
            format!("redis+sentinel://user:{PW}@a:1/svc/x"),
            format!("redis+cluster://user:{PW}@a:1/5"),
            format!("redis+cluster://user:{PW}@a:99999/"),
            format!("redis+cluster://user:{PW}@a:1/#frag"),
            format!("redis+nope://user:{PW}@a:1/"),
            format!("rediz+cluster://user:{PW}@a:1/"),
            // A password with an unescaped `/` and `@`, and one in the query.
            format!("redis+sentinel://user:{PW}/x@y@[::1:1/svc"),
            format!("redis+cluster://a:1,:2/?pass={PW}"),
        ] {
            let e = err(&url);
            assert!(!e.contains(PW), "{url}: {e}");
        }
        for url in [
            format!("redis+sentinel://user:{PW}@a:1/svc?pass={PW}"),
            format!("redis+cluster://user:{PW}@a:1/?pass={PW}"),
            format!("redis://user:{PW}@a:1/"),
        ] {
            let target = parse(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let shown = format!("{target:?}");
            assert!(!shown.contains(PW), "{shown}");
        }
    }

    #[test]
    fn redact_url_handles_the_topology_schemes() {
        assert_eq!(
            redact_url("redis+sentinel://u:pw@127.0.0.1:1,[::1]:2/svc/1?pass=pw"),
            "redis+sentinel://<redacted>@127.0.0.1:1,[::1]:2/svc/1?<redacted>"
        );
        assert_eq!(
            redact_url("rediss+sentinel://u:pw@h/svc"),
            "rediss+sentinel://<redacted>@h/svc"
        );
        assert_eq!(
            redact_url("rediss+cluster://u:pw@a:1,b:2/"),
            "rediss+cluster://<redacted>@a:1,b:2/"
        );
    }
}
