//! `hearth iam ...`: service accounts, their authorized keys and group
//! memberships, on the same store `serve` uses (safe while it runs).

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hearth_store::iam::{NewAuthorizedKey, NewServiceAccount, Removal, Role};

use crate::config::StoreLocation;
use crate::keys_cli::{open, utc};

#[derive(Debug, Subcommand)]
pub enum IamCommand {
    /// Service accounts: machine identities for the cloud API's token exchange.
    #[command(subcommand, name = "service-accounts")]
    ServiceAccounts(ServiceAccountsCommand),
    /// Authorized keys: RSA-4096 public keys that sign a service account's JWTs.
    #[command(subcommand)]
    Keys(AuthorizedKeysCommand),
    /// Groups of an account (viewers, editors, admins) and their members.
    #[command(subcommand)]
    Groups(GroupsCommand),
}

#[derive(Debug, Subcommand)]
pub enum ServiceAccountsCommand {
    /// Create a service account and print its id.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "")]
        description: String,
        /// Join this account (`account-...`) and reach its projects; default:
        /// a new account of its own reaching --project.
        #[arg(long, conflicts_with = "project")]
        account: Option<String>,
        /// The new account's project (default: the default project).
        #[arg(long)]
        project: Option<String>,
        /// The group it joins: viewer (reads), editor (uses the API), admin
        /// (also manages service accounts and keys over the cloud API).
        #[arg(long, default_value = "editor", value_parser = ["viewer", "editor", "admin", "none"])]
        role: String,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// List service accounts with their account and role.
    List(StoreLocation),
}

#[derive(Debug, Subcommand)]
pub enum AuthorizedKeysCommand {
    /// Upload a PEM public key (RSA, 4096 bits) and print the key id
    /// (the `kid` of the JWTs it signs).
    Upload {
        #[arg(long = "service-account")]
        service_account: String,
        /// The PEM file (`openssl rsa -pubout` or `cryptography` output).
        #[arg(long = "public-key")]
        public_key: std::path::PathBuf,
        /// When the key stops working: `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SSZ`
        /// or seconds since the epoch.
        #[arg(long = "expires-at")]
        expires_at: Option<String>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// List authorized keys (all, or of one service account).
    List {
        #[arg(long = "service-account")]
        service_account: Option<String>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Revoke a key: its JWTs and the access tokens issued for them are refused at once.
    Revoke {
        id: String,
        #[command(flatten)]
        location: StoreLocation,
    },
}

#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// The groups of an account and their members.
    List {
        #[arg(long)]
        account: String,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Add a service account to its account's group of a role.
    Add(Membership),
    /// Remove a service account from its account's group of a role.
    Remove(Membership),
}

#[derive(Debug, Args)]
pub struct Membership {
    #[arg(long = "service-account")]
    service_account: String,
    #[arg(long, value_parser = ["viewer", "editor", "admin"])]
    role: String,
    #[command(flatten)]
    location: StoreLocation,
}

pub async fn iam(command: IamCommand) -> anyhow::Result<()> {
    match command {
        IamCommand::ServiceAccounts(c) => service_accounts(c).await,
        IamCommand::Keys(c) => keys(c).await,
        IamCommand::Groups(c) => groups(c).await,
    }
}

async fn service_accounts(command: ServiceAccountsCommand) -> anyhow::Result<()> {
    match command {
        ServiceAccountsCommand::Create {
            name,
            description,
            account,
            project,
            role,
            location,
        } => {
            let store = open(&location).await?;
            let created = store
                .create_service_account(NewServiceAccount {
                    name,
                    description,
                    account_id: account,
                    project_id: project,
                    role: Role::parse(&role),
                })
                .await
                .context("creating the service account")?;
            println!("{}", created.id);
        }
        ServiceAccountsCommand::List(location) => {
            let store = open(&location).await?;
            println!(
                "{:<42} {:<20} {:<34} {:<8} CREATED",
                "ID", "NAME", "ACCOUNT", "ROLE"
            );
            for a in store.service_accounts(None).await? {
                let groups = store.member_groups(&a.id).await?;
                let role =
                    hearth_store::iam::ServiceAccount::role(&groups).map_or("none", Role::as_str);
                println!(
                    "{:<42} {:<20} {:<34} {:<8} {}",
                    a.id,
                    a.name,
                    a.account_id,
                    role,
                    utc(a.created_at)
                );
            }
        }
    }
    Ok(())
}

async fn keys(command: AuthorizedKeysCommand) -> anyhow::Result<()> {
    match command {
        AuthorizedKeysCommand::Upload {
            service_account,
            public_key,
            expires_at,
            location,
        } => {
            let pem = std::fs::read_to_string(&public_key)
                .with_context(|| format!("reading {}", public_key.display()))?;
            let checked = crate::iam::pem::check_public_key(&pem).map_err(anyhow::Error::msg)?;
            let expires_at = expires_at.as_deref().map(parse_time).transpose()?;
            let store = open(&location).await?;
            let key = store
                .add_authorized_key(NewAuthorizedKey {
                    service_account_id: service_account,
                    public_key: checked.pem,
                    algorithm: crate::iam::pem::ALGORITHM.to_string(),
                    fingerprint: checked.fingerprint,
                    expires_at,
                })
                .await
                .context("uploading the key")?;
            println!("{}", key.id);
        }
        AuthorizedKeysCommand::List {
            service_account,
            location,
        } => {
            let store = open(&location).await?;
            println!(
                "{:<37} {:<42} {:<18} {:<20} STATUS",
                "ID", "SERVICE ACCOUNT", "FINGERPRINT", "CREATED"
            );
            for key in store
                .authorized_keys(service_account.as_deref(), None)
                .await?
            {
                let object = crate::iam::key_object(key);
                let status = match (object.status.as_str(), object.expires_at) {
                    ("active", Some(t)) => format!("active until {}", utc(t)),
                    (s, _) => s.to_string(),
                };
                println!(
                    "{:<37} {:<42} {:<18} {:<20} {}",
                    object.id,
                    object.service_account_id,
                    format!("{}...", &object.fingerprint[..12]),
                    utc(object.created_at),
                    status
                );
            }
        }
        AuthorizedKeysCommand::Revoke { id, location } => {
            let store = open(&location).await?;
            let key = store
                .revoke_authorized_key(&id)
                .await
                .with_context(|| format!("revoking `{id}`"))?;
            println!("Revoked authorized key {}.", key.id);
        }
    }
    Ok(())
}

async fn groups(command: GroupsCommand) -> anyhow::Result<()> {
    match command {
        GroupsCommand::List { account, location } => {
            let store = open(&location).await?;
            if store.account(&account).await?.is_none() {
                bail!("no account with id `{account}`");
            }
            println!("{:<32} {:<10} {:<8} MEMBERS", "ID", "NAME", "ROLE");
            for g in store.groups(&account).await? {
                let members = store.group_members(&g.id).await?;
                println!(
                    "{:<32} {:<10} {:<8} {}",
                    g.id,
                    g.name,
                    g.role.as_str(),
                    members.join(", ")
                );
            }
        }
        GroupsCommand::Add(m) => {
            let (store, group) = membership_group(&m).await?;
            store.add_group_member(&group, &m.service_account).await?;
            println!("{} is in the {}s group.", m.service_account, m.role);
        }
        GroupsCommand::Remove(m) => {
            let (store, group) = membership_group(&m).await?;
            if store
                .remove_group_member(&group, &m.service_account)
                .await?
                == Removal::LastAdmin
            {
                bail!("{} is the account's last admin", m.service_account);
            }
            println!("{} is not in the {}s group.", m.service_account, m.role);
        }
    }
    Ok(())
}

async fn membership_group(m: &Membership) -> anyhow::Result<(hearth_store::Store, String)> {
    let store = open(&m.location).await?;
    let account = store
        .service_account(&m.service_account)
        .await?
        .with_context(|| format!("no service account `{}`", m.service_account))?;
    let role = Role::parse(&m.role).context("unknown role")?;
    let group = store
        .groups(&account.account_id)
        .await?
        .into_iter()
        .find(|g| g.name == role.group_name())
        .context("the account has no group of that role")?;
    Ok((store, group.id))
}

/// Seconds since the epoch of `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SSZ` or a number.
pub fn parse_time(s: &str) -> anyhow::Result<i64> {
    if let Ok(n) = s.parse::<i64>() {
        return Ok(n);
    }
    let bad = || anyhow::anyhow!("`{s}` is not YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or epoch seconds");
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t.strip_suffix('Z').ok_or_else(bad)?)),
        None => (s, None),
    };
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (Some(Ok(y)), Some(Ok(m)), Some(Ok(day)), None) = (d.next(), d.next(), d.next(), d.next())
    else {
        return Err(bad());
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let secs = match time {
        None => 0,
        Some(t) => {
            let mut p = t.split(':').map(|p| p.parse::<i64>());
            let (Some(Ok(h)), Some(Ok(mi)), Some(Ok(se)), None) =
                (p.next(), p.next(), p.next(), p.next())
            else {
                return Err(bad());
            };
            if h > 23 || mi > 59 || se > 60 {
                return Err(bad());
            }
            h * 3600 + mi * 60 + se
        }
    };
    Ok(hearth_store::usage::days_from_civil(y, m, day) * 86_400 + secs)
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use crate::keys_cli::utc;

    #[test]
    fn times_parse_and_round_trip() {
        assert_eq!(parse_time("0").unwrap(), 0);
        assert_eq!(parse_time("1970-01-01").unwrap(), 0);
        assert_eq!(parse_time("2000-02-29").unwrap(), 951_782_400);
        let t = parse_time("2023-11-14T22:13:20Z").unwrap();
        assert_eq!(t, 1_700_000_000);
        assert_eq!(utc(t), "2023-11-14 22:13:20");
        assert!(parse_time("2023-13-01").is_err());
        assert!(parse_time("tomorrow").is_err());
        assert!(parse_time("2023-11-14T22:13:20").is_err());
    }
}
