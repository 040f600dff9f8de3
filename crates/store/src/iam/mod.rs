//! The cloud platform API's identities.
//!
//! A service account (`serviceaccount-...`) belongs to an account and acts
//! in that account's projects. What it may do comes from the account's
//! groups it is a member of: each group has one [`Role`] (`viewer` reads,
//! `editor` uses the inference API, `admin` also manages service accounts,
//! keys and memberships). Every account has three groups, `viewers`,
//! `editors` and `admins`, made on first use. A service account proves who
//! it is with a JWT signed by one of its authorized keys ([`keys`]) and
//! gets an access token for it ([`tokens`]).

pub mod keys;
pub mod tokens;

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

pub use keys::{AuthorizedKey, NewAuthorizedKey};
pub use tokens::{IssuedToken, TokenHolder, ACCESS_TOKEN_PREFIX};

/// What a group's members may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Editor,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Editor, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The name of the account's built-in group with this role.
    pub fn group_name(self) -> &'static str {
        match self {
            Role::Viewer => "viewers",
            Role::Editor => "editors",
            Role::Admin => "admins",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceAccount {
    pub id: String,
    pub account_id: String,
    pub name: String,
    pub description: String,
    pub created_at: i64,
}

impl ServiceAccount {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            account_id: row.try_get("account_id")?,
            name: row.try_get("name")?,
            description: row.try_get("description")?,
            created_at: row.try_get("created_at")?,
        })
    }

    /// The strongest role of its groups (none: it may only read its profile).
    pub fn role(groups: &[Group]) -> Option<Role> {
        groups.iter().map(|g| g.role).max()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub id: String,
    pub account_id: String,
    pub name: String,
    pub role: Role,
    pub created_at: i64,
}

impl Group {
    fn from_row(row: &AnyRow) -> Result<Self> {
        let role: String = row.try_get("role")?;
        Ok(Self {
            id: row.try_get("id")?,
            account_id: row.try_get("account_id")?,
            name: row.try_get("name")?,
            role: Role::parse(&role)
                .ok_or_else(|| StoreError::Invalid(format!("unknown stored role `{role}`")))?,
            created_at: row.try_get("created_at")?,
        })
    }
}

/// Where a new service account goes.
#[derive(Debug, Clone, Default)]
pub struct NewServiceAccount {
    pub name: String,
    pub description: String,
    /// Join this account (and reach its projects); none: a new account
    /// named after the service account, reaching `project_id`.
    pub account_id: Option<String>,
    /// For a new account: its project (default: the default project).
    pub project_id: Option<String>,
    /// Put it in the account's group of this role.
    pub role: Option<Role>,
}

/// What [`Store::remove_group_member`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// The service account was not a member (or the group does not exist).
    NotMember,
    /// Refused: it is the last member of an `admin` group.
    LastAdmin,
}

const SELECT_SA: &str =
    "SELECT id, account_id, name, description, created_at FROM service_accounts";

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

impl Store {
    pub async fn create_service_account(&self, new: NewServiceAccount) -> Result<ServiceAccount> {
        let name = new.name.trim();
        if name.is_empty() || name.len() > 128 {
            return Err(StoreError::Invalid(
                "a service account's name must be 1 to 128 characters".into(),
            ));
        }
        let account_id = match &new.account_id {
            Some(id) => {
                self.account(id)
                    .await?
                    .ok_or_else(|| StoreError::Invalid(format!("no account with id `{id}`")))?;
                id.clone()
            }
            None => {
                let project = match &new.project_id {
                    Some(p) => p.clone(),
                    None => self.default_project().await?.id,
                };
                self.create_account(name, &project, false).await?.id
            }
        };
        let account = ServiceAccount {
            id: new_id(ids::SERVICE_ACCOUNT),
            account_id,
            name: name.to_string(),
            description: new.description.clone(),
            created_at: now(),
        };
        let inserted = sqlx::query(
            "INSERT INTO service_accounts (id, account_id, name, description, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&account.id)
        .bind(&account.account_id)
        .bind(&account.name)
        .bind(&account.description)
        .bind(account.created_at)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => {
                return Err(StoreError::InUse(format!(
                    "the account already has a service account named `{name}`"
                )))
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(role) = new.role {
            let group = self.role_group(&account.account_id, role).await?;
            self.add_group_member(&group.id, &account.id).await?;
        }
        Ok(account)
    }

    pub async fn service_account(&self, id: &str) -> Result<Option<ServiceAccount>> {
        let row = sqlx::query(&format!("{SELECT_SA} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(ServiceAccount::from_row).transpose()
    }

    /// The service accounts of `account_id` (all of them for none), oldest first.
    pub async fn service_accounts(&self, account_id: Option<&str>) -> Result<Vec<ServiceAccount>> {
        let rows = match account_id {
            Some(a) => {
                sqlx::query(&format!("{SELECT_SA} WHERE account_id = $1 ORDER BY id"))
                    .bind(a)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query(&format!("{SELECT_SA} ORDER BY id"))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(ServiceAccount::from_row).collect()
    }

    /// The account's groups (viewers, editors, admins), making its three
    /// built-in ones on first use.
    pub async fn groups(&self, account_id: &str) -> Result<Vec<Group>> {
        for role in Role::ALL {
            self.role_group(account_id, role).await?;
        }
        let rows = sqlx::query(
            "SELECT id, account_id, name, role, created_at FROM iam_groups \
             WHERE account_id = $1 ORDER BY id",
        )
        .bind(account_id)
        .fetch_all(&self.pool)
        .await?;
        let mut groups = rows
            .iter()
            .map(Group::from_row)
            .collect::<Result<Vec<_>>>()?;
        groups.sort_by_key(|g| g.role);
        Ok(groups)
    }

    pub async fn group(&self, id: &str) -> Result<Option<Group>> {
        let row = sqlx::query(
            "SELECT id, account_id, name, role, created_at FROM iam_groups WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(Group::from_row).transpose()
    }

    /// The account's built-in group of `role`, made when missing (safe when
    /// two callers race: the unique name keeps one).
    async fn role_group(&self, account_id: &str, role: Role) -> Result<Group> {
        let find = || async {
            let row = sqlx::query(
                "SELECT id, account_id, name, role, created_at FROM iam_groups \
                 WHERE account_id = $1 AND name = $2",
            )
            .bind(account_id)
            .bind(role.group_name())
            .fetch_optional(&self.pool)
            .await?;
            row.as_ref().map(Group::from_row).transpose()
        };
        if let Some(group) = find().await? {
            return Ok(group);
        }
        let inserted = sqlx::query(
            "INSERT INTO iam_groups (id, account_id, name, role, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(new_id(ids::GROUP))
        .bind(account_id)
        .bind(role.group_name())
        .bind(role.as_str())
        .bind(now())
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => {}
            Err(e) => return Err(e.into()),
        }
        find().await?.ok_or(StoreError::NotFound("group"))
    }

    /// Adds a service account of the group's account to the group (twice is fine).
    pub async fn add_group_member(&self, group_id: &str, service_account_id: &str) -> Result<()> {
        let group = self
            .group(group_id)
            .await?
            .ok_or(StoreError::NotFound("group"))?;
        let account = self
            .service_account(service_account_id)
            .await?
            .ok_or(StoreError::NotFound("service account"))?;
        if account.account_id != group.account_id {
            return Err(StoreError::Invalid(
                "a group's members must be service accounts of the same account".into(),
            ));
        }
        sqlx::query(
            "INSERT INTO iam_group_members (group_id, service_account_id, created_at) \
             VALUES ($1, $2, $3) ON CONFLICT (group_id, service_account_id) DO NOTHING",
        )
        .bind(group_id)
        .bind(service_account_id)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes a member. The last member of an `admin` group stays: the
    /// account would have no admin left. The group's row is locked first
    /// (a write on both SQLite and PostgreSQL), so two removals at once
    /// count the members one after the other.
    pub async fn remove_group_member(
        &self,
        group_id: &str,
        service_account_id: &str,
    ) -> Result<Removal> {
        let mut tx = self.pool.begin().await?;
        let locked = sqlx::query("UPDATE iam_groups SET role = role WHERE id = $1")
            .bind(group_id)
            .execute(&mut *tx)
            .await?;
        if locked.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(Removal::NotMember);
        }
        let role: String = sqlx::query("SELECT role FROM iam_groups WHERE id = $1")
            .bind(group_id)
            .fetch_one(&mut *tx)
            .await?
            .try_get("role")?;
        let members: i64 =
            sqlx::query("SELECT count(*) AS n FROM iam_group_members WHERE group_id = $1")
                .bind(group_id)
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
        let done = sqlx::query(
            "DELETE FROM iam_group_members WHERE group_id = $1 AND service_account_id = $2",
        )
        .bind(group_id)
        .bind(service_account_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(Removal::NotMember);
        }
        if Role::parse(&role) == Some(Role::Admin) && members <= 1 {
            tx.rollback().await?;
            return Ok(Removal::LastAdmin);
        }
        tx.commit().await?;
        Ok(Removal::Removed)
    }

    /// The groups a service account is a member of.
    pub async fn member_groups(&self, service_account_id: &str) -> Result<Vec<Group>> {
        let rows = sqlx::query(
            "SELECT g.id, g.account_id, g.name, g.role, g.created_at FROM iam_groups g \
             JOIN iam_group_members m ON m.group_id = g.id \
             WHERE m.service_account_id = $1 ORDER BY g.id",
        )
        .bind(service_account_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(Group::from_row).collect()
    }

    /// The members of a group.
    pub async fn group_members(&self, group_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT service_account_id FROM iam_group_members WHERE group_id = $1 \
             ORDER BY service_account_id",
        )
        .bind(group_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("service_account_id")?))
            .collect()
    }
}
