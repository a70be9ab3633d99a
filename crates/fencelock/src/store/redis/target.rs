//! The one URL for every Redis topology, parsed into what to connect to.
//!
//! | URL | connects to |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS) | one server; a Cluster node given this way is detected at connect |
//! | `unix:///path[?db=N&user=U&pass=P]`, `redis+unix://…` | one server over a Unix socket |
//! | `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER[?db=N]`, `rediss+sentinel://…` | the master named `MASTER`, found through the sentinels listed; `user:pass` are the data nodes' credentials, `sentinel_user`/`sentinel_password` query parameters the sentinels' own, if they have any |
//! | `redis+cluster://[user:pass@]host:port[,host:port…]`, `rediss+cluster://…` | Redis Cluster, discovered from these seed nodes |

use crate::error::{Error, Result};
use crate::store::url::{percent_decoded, redact};

/// What a URL names. Its `Debug` shows no password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server (TCP, TLS or a Unix socket): the URL as redis-rs reads it.
    Single(String),
    /// The master of a Sentinel-monitored set.
    Sentinel(SentinelTarget),
    /// A Redis Cluster.
    Cluster(Nodes),
}

/// Several `host:port` addresses and the credentials to use on them.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Nodes {
    pub(crate) addrs: Vec<(String, u16)>,
    pub(crate) tls: bool,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// A master found through sentinels.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelTarget {
    /// The sentinels, and the data nodes' credentials and database.
    pub(crate) nodes: Nodes,
    /// The name the sentinels monitor the master under.
    pub(crate) master: String,
    pub(crate) sentinel_user: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

/// `***` for a password that is set: `Debug` output may reach logs.
fn hidden(password: Option<&String>) -> Option<&'static str> {
    password.map(|_| "***")
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            Target::Sentinel(s) => f.debug_tuple("Sentinel").field(s).finish(),
            Target::Cluster(nodes) => f.debug_tuple("Cluster").field(nodes).finish(),
        }
    }
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("addrs", &self.addrs)
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &hidden(self.password.as_ref()))
            .field("db", &self.db)
            .finish()
    }
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("nodes", &self.nodes)
            .field("master", &self.master)
            .field("sentinel_user", &self.sentinel_user)
            .field(
                "sentinel_password",
                &hidden(self.sentinel_password.as_ref()),
            )
            .finish()
    }
}

impl Target {
    /// Parses `url`. Errors show the URL without its password and name the
    /// one part that is wrong.
    pub(crate) fn parse(url: &str) -> Result<Target> {
        let bad =
            |what: &str| Error::InvalidOption(format!("bad Redis URL {}: {what}", redact(url)));
        let Some((scheme, rest)) = url.split_once("://") else {
            // Not shown: text without a scheme may be anything, a password
            // pasted in the wrong place included.
            return Err(Error::InvalidOption(
                "bad Redis URL: it has no scheme (redis://, rediss://, unix://, redis+sentinel://, redis+cluster://)"
                    .to_owned(),
            ));
        };
        let (topology, tls) = match scheme.to_ascii_lowercase().as_str() {
            "redis" | "rediss" => {
                check_params(url, &["protocol", "timeout"]).map_err(|what| bad(&what))?;
                return Ok(Target::Single(url.to_owned()));
            }
            "unix" | "redis+unix" => {
                check_params(url, &["db", "user", "pass", "protocol", "timeout"])
                    .map_err(|what| bad(&what))?;
                return Ok(Target::Single(url.to_owned()));
            }
            "redis+sentinel" => ("sentinel", false),
            "rediss+sentinel" => ("sentinel", true),
            "redis+cluster" => ("cluster", false),
            "rediss+cluster" => ("cluster", true),
            other => {
                return Err(bad(&format!(
                    "unknown scheme {other:?} (use redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://)"
                )));
            }
        };
        // Everything before the last '@' is userinfo (a raw password may hold
        // '/', '?' or '#').
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, rest),
        };
        let (user, password) = match userinfo {
            Some(info) => {
                let (user, password) = info.split_once(':').unwrap_or((info, ""));
                (
                    Some(percent_decoded(user)).filter(|u| !u.is_empty()),
                    Some(percent_decoded(password)).filter(|p| !p.is_empty()),
                )
            }
            None => (None, None),
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let addrs = parse_hosts(hosts).map_err(|what| bad(&what))?;
        let mut db = 0;
        let mut sentinel_user = None;
        let mut sentinel_password = None;
        for param in query.split('&').filter(|p| !p.is_empty()) {
            let Some((name, value)) = param.split_once('=') else {
                return Err(bad(BARE_PARAM));
            };
            match name {
                "db" => {
                    db = value
                        .parse()
                        .map_err(|_| bad("the db parameter is not a database number"))?;
                }
                "sentinel_user" | "sentinel_username" => {
                    sentinel_user = Some(percent_decoded(value));
                }
                "sentinel_password" | "sentinel_pass" => {
                    sentinel_password = Some(percent_decoded(value));
                }
                // Tolerated for URLs shared with other clients.
                "protocol" | "timeout" => {}
                other => {
                    return Err(bad(&format!(
                        "unknown parameter {other:?}{} (it takes db, sentinel_user, sentinel_password)",
                        password_hint(other)
                    )));
                }
            }
        }
        let nodes = Nodes {
            addrs,
            tls,
            user,
            password,
            db,
        };
        if topology == "cluster" {
            if !path.is_empty() {
                return Err(bad(
                    "a cluster URL has no path (Redis Cluster has only database 0)",
                ));
            }
            if db != 0 {
                return Err(bad("Redis Cluster has only database 0"));
            }
            return Ok(Target::Cluster(nodes));
        }
        let master = percent_decoded(path.trim_end_matches('/'));
        if master.is_empty() || master.contains('/') {
            return Err(bad(
                "a sentinel URL names the master after the hosts: redis+sentinel://h1:26379,h2:26379/MASTER",
            ));
        }
        Ok(Target::Sentinel(SentinelTarget {
            nodes,
            master,
            sentinel_user,
            sentinel_password,
        }))
    }
}

/// Said of a query parameter without `=VALUE`: it is not named, because a
/// bare word there may be a password pasted in the wrong place.
const BARE_PARAM: &str = "a query parameter has no =VALUE";

/// Checks that the query of the one-server `url` names only parameters in
/// `known` (redis-rs ignores the others, so a misspelt `pass` would connect
/// without a password). Names the parameter, never its value.
fn check_params(url: &str, known: &[&str]) -> std::result::Result<(), String> {
    let location = url.rsplit_once('@').map_or(url, |(_, l)| l);
    let location = location.split_once('#').map_or(location, |(l, _)| l);
    let Some((_, query)) = location.split_once('?') else {
        return Ok(());
    };
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let Some((name, _)) = param.split_once('=') else {
            return Err(BARE_PARAM.to_owned());
        };
        if !known.contains(&name) {
            return Err(format!(
                "unknown parameter {name:?}{} (it takes {})",
                password_hint(name),
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// A hint for an unknown parameter that looks like a password's.
fn password_hint(name: &str) -> &'static str {
    let lower = name.to_ascii_lowercase();
    if ["pass", "pw", "pwd", "secret", "auth", "token"]
        .iter()
        .any(|p| lower.contains(p))
    {
        "; a password goes in the user info, redis://[USER]:PASSWORD@HOST"
    } else {
        ""
    }
}

/// `host:port[,host:port…]`, IPv6 hosts in brackets; the port is required
/// (Sentinel and Cluster have no one default port).
fn parse_hosts(hosts: &str) -> std::result::Result<Vec<(String, u16)>, String> {
    let mut addrs = Vec::new();
    for item in hosts.split(',') {
        let (host, port) = match item.strip_prefix('[') {
            Some(v6) => {
                let (host, rest) = v6
                    .split_once(']')
                    .ok_or_else(|| format!("host {item:?} lacks its closing ']'"))?;
                (host, rest.strip_prefix(':').unwrap_or(""))
            }
            None => item.rsplit_once(':').unwrap_or((item, "")),
        };
        if host.is_empty() {
            return Err(format!("an empty host in {hosts:?}"));
        }
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("host {item:?} needs a port (host:port)"))?;
        addrs.push((host.to_owned(), port));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_are_single_servers() -> Result<()> {
        for url in [
            "redis://h:1/2",
            "rediss://u:p@h:1",
            "unix:///s?db=1",
            "redis+unix:///s",
        ] {
            assert_eq!(Target::parse(url)?, Target::Single(url.to_owned()));
        }
        Ok(())
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_master_and_credentials() -> Result<()> {
        let t = Target::parse(
            "rediss+sentinel://app:p%40ss@10.0.0.1:26379,[::1]:26380/my-master?db=3&sentinel_password=s",
        )?;
        let Target::Sentinel(s) = t else {
            panic!("{t:?}")
        };
        assert_eq!(
            s.nodes.addrs,
            vec![("10.0.0.1".to_owned(), 26379), ("::1".to_owned(), 26380)]
        );
        assert!(s.nodes.tls);
        assert_eq!(
            (s.nodes.user.as_deref(), s.nodes.password.as_deref()),
            (Some("app"), Some("p@ss"))
        );
        assert_eq!((s.nodes.db, s.master.as_str()), (3, "my-master"));
        assert_eq!(s.sentinel_password.as_deref(), Some("s"));
        Ok(())
    }

    #[test]
    fn cluster_urls_list_seeds() -> Result<()> {
        let t = Target::parse("redis+cluster://:pw@a:7000,b:7001")?;
        assert_eq!(
            t,
            Target::Cluster(Nodes {
                addrs: vec![("a".to_owned(), 7000), ("b".to_owned(), 7001)],
                tls: false,
                user: None,
                password: Some("pw".to_owned()),
                db: 0,
            })
        );
        Ok(())
    }

    #[test]
    fn mistakes_are_named_and_passwords_hidden() {
        for (url, what) in [
            ("redis+sentinel://h:1", "names the master"),
            ("redis+sentinel://h/m", "needs a port"),
            ("redis+sentinel://h:x/m", "needs a port"),
            ("redis+cluster://a:1,,b:2", "empty host"),
            ("redis+cluster://a:1/0", "no path"),
            ("redis+cluster://a:1?db=2", "only database 0"),
            (
                "redis+sentinel://:SECRET@h:1/m?color=red",
                "unknown parameter",
            ),
            ("memcached://h:1", "unknown scheme"),
            (
                "redis://h:1/?pasword=SECRET",
                "unknown parameter \"pasword\"",
            ),
            ("redis://h:1/?SECRET", "no =VALUE"),
            (
                "unix:///s?password=SECRET",
                "unknown parameter \"password\"",
            ),
            (
                "redis+sentinel://h:1/m?sentinel_pasword=SECRET",
                "unknown parameter \"sentinel_pasword\"",
            ),
            ("redis+sentinel://h:1/m?db=SECRET", "db parameter"),
            ("redis+sentinel://h:1/m?SECRET", "no =VALUE"),
            (
                "redis+cluster://SECRET@h:1?x=SECRET",
                "unknown parameter \"x\"",
            ),
            ("h:1", "no scheme"),
        ] {
            let e = Target::parse(url)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(what), "{url}: {e}");
            assert!(!e.contains("SECRET"), "{e}");
        }
    }

    #[test]
    fn debug_shows_no_password() -> Result<()> {
        for url in [
            "redis+sentinel://u:SECRET@h:1/m?sentinel_password=SECRET",
            "redis+cluster://:SECRET@h:1",
            "redis://u:SECRET@h:1",
        ] {
            let shown = format!("{:?}", Target::parse(url)?);
            assert!(
                !shown.contains("SECRET") && shown.contains("***"),
                "{shown}"
            );
        }
        Ok(())
    }
}
