//! IAM repository tests: service accounts (own account or joining one,
//! unique names per account), built-in groups and memberships (roles),
//! authorized keys (expiry, revoke), access tokens (live, expired, dead
//! with their key), JWT ids used once and the last admin kept when
//! admins are removed at once. Each runs on SQLite, and on
//! PostgreSQL when `HEARTH_TEST_DATABASE_URL` names a server.

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use hearth_store::iam::{NewAuthorizedKey, NewServiceAccount, Removal, Role, ServiceAccount};
use hearth_store::ids::now;
use hearth_store::{Store, StoreError};

on_both!(
    service_accounts_join_accounts_and_groups,
    keys_and_tokens_live_and_die_together,
    jwt_ids_are_used_once,
    admins_removed_at_once_leave_one,
);

async fn key(s: &Store, sa: &str, expires_at: Option<i64>) -> hearth_store::iam::AuthorizedKey {
    s.add_authorized_key(NewAuthorizedKey {
        service_account_id: sa.to_string(),
        public_key: "-----BEGIN PUBLIC KEY-----".into(),
        algorithm: "RSA_4096".into(),
        fingerprint: format!("{:064x}", expires_at.unwrap_or(0)),
        expires_at,
    })
    .await
    .unwrap()
}

async fn service_accounts_join_accounts_and_groups(env: Env) {
    let s = &env.store;
    let project = s.create_project("Team").await.unwrap().id;
    let first = s
        .create_service_account(NewServiceAccount {
            name: "deployer".into(),
            project_id: Some(project.clone()),
            role: Some(Role::Admin),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(first.id.starts_with("serviceaccount-"));
    assert_eq!(
        s.account_projects(&first.account_id).await.unwrap(),
        vec![project.clone()]
    );
    let second = s
        .create_service_account(NewServiceAccount {
            name: "reader".into(),
            account_id: Some(first.account_id.clone()),
            role: Some(Role::Viewer),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(second.account_id, first.account_id);
    let taken = s
        .create_service_account(NewServiceAccount {
            name: "reader".into(),
            account_id: Some(first.account_id.clone()),
            ..Default::default()
        })
        .await;
    assert!(matches!(taken, Err(StoreError::InUse(_))), "{taken:?}");
    assert_eq!(
        s.service_accounts(Some(&first.account_id))
            .await
            .unwrap()
            .len(),
        2
    );

    let groups = s.groups(&first.account_id).await.unwrap();
    let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, vec!["viewers", "editors", "admins"]);
    assert_eq!(
        ServiceAccount::role(&s.member_groups(&first.id).await.unwrap()),
        Some(Role::Admin)
    );
    let editors = groups.iter().find(|g| g.role == Role::Editor).unwrap();
    s.add_group_member(&editors.id, &second.id).await.unwrap();
    s.add_group_member(&editors.id, &second.id).await.unwrap();
    assert_eq!(
        ServiceAccount::role(&s.member_groups(&second.id).await.unwrap()),
        Some(Role::Editor)
    );
    assert_eq!(
        s.remove_group_member(&editors.id, &second.id)
            .await
            .unwrap(),
        Removal::Removed
    );
    assert_eq!(
        s.remove_group_member(&editors.id, &second.id)
            .await
            .unwrap(),
        Removal::NotMember
    );
    assert_eq!(
        ServiceAccount::role(&s.member_groups(&second.id).await.unwrap()),
        Some(Role::Viewer)
    );
    // A service account of another account cannot join.
    let stranger = s
        .create_service_account(NewServiceAccount {
            name: "stranger".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(s.add_group_member(&editors.id, &stranger.id).await.is_err());
    assert_eq!(
        ServiceAccount::role(&s.member_groups(&stranger.id).await.unwrap()),
        None
    );
}

async fn keys_and_tokens_live_and_die_together(env: Env) {
    let s = &env.store;
    let sa = s
        .create_service_account(NewServiceAccount {
            name: "svc".into(),
            role: Some(Role::Editor),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(s
        .add_authorized_key(NewAuthorizedKey {
            service_account_id: sa.id.clone(),
            public_key: String::new(),
            algorithm: String::new(),
            fingerprint: String::new(),
            expires_at: Some(now() - 1),
        })
        .await
        .is_err());
    let k = key(s, &sa.id, None).await;
    assert!(k.id.starts_with("publickey-") && k.is_active(now()));
    let again = s
        .add_authorized_key(NewAuthorizedKey {
            service_account_id: sa.id.clone(),
            public_key: k.public_key.clone(),
            algorithm: k.algorithm.clone(),
            fingerprint: k.fingerprint.clone(),
            expires_at: None,
        })
        .await;
    assert!(matches!(again, Err(StoreError::InUse(_))), "{again:?}");
    let soon = key(s, &sa.id, Some(now() + 2)).await;
    assert!(!soon.is_active(now() + 3));

    let token = s.issue_access_token(&sa.id, &k.id, 43_200).await.unwrap();
    assert!(token.token.starts_with("hearthtok_"));
    let holder = s.token_holder(&token.token).await.unwrap().unwrap();
    assert_eq!(holder.service_account_id, sa.id);
    assert_eq!(holder.account_id, sa.account_id);
    assert_eq!(
        holder.default_project_id,
        s.default_project().await.unwrap().id
    );
    assert!(s.token_holder("hearthtok_nope").await.unwrap().is_none());
    assert!(s.token_holder("hearth-key").await.unwrap().is_none());
    let expired = s.issue_access_token(&sa.id, &k.id, -1).await.unwrap();
    assert!(s.token_holder(&expired.token).await.unwrap().is_none());

    let listed = s.authorized_keys(Some(&sa.id), None).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        s.authorized_keys(None, Some(&sa.account_id)).await.unwrap(),
        listed
    );
    let revoked = s.revoke_authorized_key(&k.id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    assert_eq!(s.revoke_authorized_key(&k.id).await.unwrap(), revoked);
    assert!(s.token_holder(&token.token).await.unwrap().is_none());
}

async fn jwt_ids_are_used_once(env: Env) {
    let s = &env.store;
    let a = s
        .create_service_account(NewServiceAccount {
            name: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let b = s
        .create_service_account(NewServiceAccount {
            name: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let exp = now() + 300;
    assert!(s.use_jwt_id(&a.id, "j1", exp).await.unwrap());
    assert!(!s.use_jwt_id(&a.id, "j1", exp).await.unwrap());
    assert!(s.use_jwt_id(&b.id, "j1", exp).await.unwrap());
    assert!(s.use_jwt_id(&a.id, "j2", exp).await.unwrap());
}

/// Admins removed from `admins` at the same time: each round, every admin
/// of the group is removed concurrently; exactly one stays (refused as the
/// last), and a lone admin cannot be removed at all.
async fn admins_removed_at_once_leave_one(env: Env) {
    let s = &env.store;
    let project = s.create_project("Race").await.unwrap().id;
    let first = s
        .create_service_account(NewServiceAccount {
            name: "admin-0".into(),
            project_id: Some(project),
            role: Some(Role::Admin),
            ..Default::default()
        })
        .await
        .unwrap();
    let admins = s
        .groups(&first.account_id)
        .await
        .unwrap()
        .into_iter()
        .find(|g| g.role == Role::Admin)
        .unwrap();
    for round in 0..5 {
        let mut ids = vec![s.group_members(&admins.id).await.unwrap()[0].clone()];
        for i in 1..4 {
            let sa = s
                .create_service_account(NewServiceAccount {
                    name: format!("admin-{round}-{i}"),
                    account_id: Some(first.account_id.clone()),
                    role: Some(Role::Admin),
                    ..Default::default()
                })
                .await
                .unwrap();
            ids.push(sa.id);
        }
        assert_eq!(s.group_members(&admins.id).await.unwrap().len(), 4);
        let removals = ids.iter().map(|id| {
            let (s, group) = (s.clone(), admins.id.clone());
            let id = id.clone();
            tokio::spawn(async move { s.remove_group_member(&group, &id).await.unwrap() })
        });
        let mut outcomes = Vec::new();
        for r in removals.collect::<Vec<_>>() {
            outcomes.push(r.await.unwrap());
        }
        let kept = outcomes
            .iter()
            .filter(|o| **o == Removal::LastAdmin)
            .count();
        assert_eq!(kept, 1, "round {round}: {outcomes:?}");
        let left = s.group_members(&admins.id).await.unwrap();
        assert_eq!(left.len(), 1, "round {round}");
        assert_eq!(
            s.remove_group_member(&admins.id, &left[0]).await.unwrap(),
            Removal::LastAdmin
        );
    }
}
