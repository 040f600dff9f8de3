//! Accounts: who holds API keys. An account reaches one or more projects
//! and has a default one; an admin account may also manage keys and projects.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::{self, new_id, now};
use crate::Store;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Account {
    pub id: String,
    pub name: String,
    pub is_admin: bool,
    pub default_project_id: String,
    pub created_at: i64,
}

impl Account {
    fn from_row(row: &AnyRow) -> Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            is_admin: row.try_get::<i64, _>("is_admin")? != 0,
            default_project_id: row.try_get("default_project_id")?,
            created_at: row.try_get("created_at")?,
        })
    }
}

impl Store {
    /// A new account reaching `project_id` (its default project).
    pub async fn create_account(
        &self,
        name: &str,
        project_id: &str,
        is_admin: bool,
    ) -> Result<Account> {
        if self.project(project_id).await?.is_none() {
            return Err(StoreError::Invalid(format!(
                "no project with id `{project_id}`"
            )));
        }
        let account = Account {
            id: new_id(ids::ACCOUNT),
            name: name.to_string(),
            is_admin,
            default_project_id: project_id.to_string(),
            created_at: now(),
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO accounts (id, name, is_admin, default_project_id, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&account.id)
        .bind(&account.name)
        .bind(i64::from(is_admin))
        .bind(&account.default_project_id)
        .bind(account.created_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO account_projects (account_id, project_id) VALUES ($1, $2)")
            .bind(&account.id)
            .bind(project_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(account)
    }

    pub async fn account(&self, id: &str) -> Result<Option<Account>> {
        let row = sqlx::query(
            "SELECT id, name, is_admin, default_project_id, created_at FROM accounts WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(Account::from_row).transpose()
    }

    /// Lets `account_id` reach `project_id` too.
    pub async fn grant_project(&self, account_id: &str, project_id: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO account_projects (account_id, project_id) VALUES ($1, $2) \
             ON CONFLICT (account_id, project_id) DO NOTHING",
        )
        .bind(account_id)
        .bind(project_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Whether `account_id` may act in `project_id`.
    pub async fn can_reach(&self, account_id: &str, project_id: &str) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 AS one FROM account_projects WHERE account_id = $1 AND project_id = $2",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    /// The projects `account_id` reaches.
    pub async fn account_projects(&self, account_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT project_id FROM account_projects WHERE account_id = $1 ORDER BY project_id",
        )
        .bind(account_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("project_id")?))
            .collect()
    }

    /// Whether any admin account holds a key that is not revoked.
    pub async fn has_admin_key(&self) -> Result<bool> {
        let row = sqlx::query(
            "SELECT 1 AS one FROM api_keys k JOIN accounts a ON a.id = k.account_id \
             WHERE a.is_admin = 1 AND k.revoked_at IS NULL LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }
}
