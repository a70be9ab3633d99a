//! What an `etcd://` or `etcds://` URL names: the members, TLS, the
//! credentials and the namespace.

use crate::error::{Error, Result};
use crate::store::url::{percent_decoded, redact};

/// The default client port of etcd.
const DEFAULT_PORT: u16 = 2379;

/// What an `etcd://` or `etcds://` URL names. Its `Debug` shows no
/// password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct EtcdTarget {
    /// `host:port` of every listed member.
    pub(crate) hosts: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) user: Option<(String, String)>,
    /// Put in front of every key (`?prefix=`).
    pub(crate) namespace: String,
}

impl std::fmt::Debug for EtcdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTarget")
            .field("hosts", &self.hosts)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(user, _)| (user, "***")))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl EtcdTarget {
    /// Parses an etcd URL.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] saying what is wrong (the URL shown without
    /// its password).
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidOption(format!("bad etcd URL {}: {why}", redact(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected etcd://HOST:PORT[,HOST:PORT…]"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("the scheme must be etcd or etcds")),
        };
        let (userinfo, location) = match rest.rsplit_once('@') {
            Some((userinfo, location)) => (Some(userinfo), location),
            None => (None, rest),
        };
        let user = match userinfo {
            None => None,
            Some(info) => match info.split_once(':') {
                Some((user, password)) if !user.is_empty() => {
                    Some((percent_decoded(user), percent_decoded(password)))
                }
                _ => return Err(bad("credentials must be USER:PASSWORD@")),
            },
        };
        let (hosts, query) = match location.split_once('?') {
            Some((hosts, query)) => (hosts, Some(query)),
            None => (location, None),
        };
        let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
        let mut namespace = String::new();
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            // Named, never with its value: `?token=` or `?auth=` hold a
            // secret, and a bare word may be a password in the wrong place.
            match param.split_once('=') {
                Some(("prefix", value)) => namespace = percent_decoded(value),
                _ if param.is_empty() => {}
                Some((name, _)) => {
                    return Err(bad(&format!(
                        "unknown parameter {name:?} (etcd URLs take prefix=NAMESPACE; credentials go in the user info, etcd://USER:PASSWORD@HOST)"
                    )));
                }
                None => {
                    return Err(bad(
                        "a query parameter has no =VALUE (etcd URLs take prefix=NAMESPACE)",
                    ));
                }
            }
        }
        let hosts = hosts
            .split(',')
            .map(|host| with_port(host).ok_or_else(|| bad(&format!("bad member address {host:?}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(EtcdTarget {
            hosts,
            tls,
            user,
            namespace,
        })
    }

    /// The client's endpoints (`http://host:port`, `https` with TLS).
    pub(crate) fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }
}

/// `host:port` with etcd's default port added when missing; `None` for an
/// empty or malformed address.
fn with_port(host: &str) -> Option<String> {
    if host.is_empty() || host.contains(['/', ' ']) {
        return None;
    }
    // [v6]:port, [v6], host:port, host.
    if let Some(rest) = host.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        return match after {
            "" => Some(format!("[{addr}]:{DEFAULT_PORT}")),
            p => p
                .strip_prefix(':')?
                .parse::<u16>()
                .ok()
                .map(|port| format!("[{addr}]:{port}")),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && !name.contains(':') => port
            .parse::<u16>()
            .ok()
            .map(|port| format!("{name}:{port}")),
        Some(_) => None,
        None => Some(format!("{host}:{DEFAULT_PORT}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_members_credentials_and_a_namespace() -> Result<()> {
        let t = EtcdTarget::parse("etcd://10.0.0.1:2379,10.0.0.2,[::1]:2381/?prefix=%2Fapp%2F")?;
        assert_eq!(t.hosts, ["10.0.0.1:2379", "10.0.0.2:2379", "[::1]:2381"]);
        assert_eq!(t.namespace, "/app/");
        assert!(!t.tls);
        assert_eq!(
            t.endpoints(),
            [
                "http://10.0.0.1:2379",
                "http://10.0.0.2:2379",
                "http://[::1]:2381"
            ]
        );
        let t = EtcdTarget::parse("etcds://app:s%40cret@db:2379")?;
        assert!(t.tls);
        assert_eq!(t.user, Some(("app".into(), "s@cret".into())));
        assert_eq!(t.endpoints(), ["https://db:2379"]);
        assert!(crate::store::is_etcd_url("ETCD://x") && crate::store::is_etcd_url("etcds://x"));
        assert!(!crate::store::is_etcd_url("redis://x"));
        Ok(())
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for bad in [
            "etcd://",
            "etcd://h:99999",
            "etcd://h:1?db=2",
            "etcd://:pw@h",
            "etcd://a,,b",
            "http://h:2379",
        ] {
            assert!(EtcdTarget::parse(bad).is_err(), "{bad}");
        }
        let e = EtcdTarget::parse("etcd://u:topsecret@h:1?x=1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("topsecret") && e.contains("***"), "{e}");
        for (url, what) in [
            ("etcd://h:1?auth=topsecret", "unknown parameter \"auth\""),
            ("etcd://h:1?token=topsecret", "unknown parameter \"token\""),
            ("etcd://h:1?topsecret", "no =VALUE"),
            ("etcd://topsecret@h:1", "USER:PASSWORD@"),
        ] {
            let e = EtcdTarget::parse(url)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(what) && !e.contains("topsecret"), "{url}: {e}");
        }
        let t = EtcdTarget::parse("etcd://u:topsecret@h:1");
        let shown = format!("{t:?}");
        assert!(
            !shown.contains("topsecret") && shown.contains("***"),
            "{shown}"
        );
    }
}
