//! Handlers of the cloud platform API. Reads need any role of the
//! caller's account (`viewer` and up); changes need `admin`. A resource of
//! another account is refused exactly like a missing one (403 code 7).

use axum::extract::{RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use hearth_api::cloud::{
    AddMember, AuthorizedKeyObject, CloudError, CloudList, CreateServiceAccount, GroupObject,
    Profile, ServiceAccountObject, ServiceAccountProfile, TokenExchangeForm, TokenExchangeResponse,
    UploadAuthorizedKey, ACCESS_TOKEN_LIFETIME_SECS, TOKEN_TYPE_ACCESS_TOKEN,
};
use hearth_store::iam::{
    AuthorizedKey, Group, NewAuthorizedKey, NewServiceAccount, Removal, Role, ServiceAccount,
};
use hearth_store::ids::now;
use hearth_store::Store;

use super::{
    no_access, verify_subject_jwt, CloudBytes, CloudCaller, CloudHttpError, CloudJson, CloudPath,
};
use crate::state::AppState;

type CloudResult<T> = Result<Json<T>, CloudHttpError>;

pub async fn exchange(
    State(state): State<AppState>,
    headers: HeaderMap,
    CloudBytes(body): CloudBytes,
) -> Result<impl axum::response::IntoResponse, CloudHttpError> {
    let form_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';').next().is_some_and(|t| {
                t.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        });
    if !form_type {
        return Err(CloudError::invalid(
            "The token exchange takes `application/x-www-form-urlencoded` form fields.",
        )
        .into());
    }
    let form = TokenExchangeForm::parse(&body)?;
    let jwt = form.subject_jwt()?;
    let verified = verify_subject_jwt(&state.store, jwt, now()).await?;
    let issued = state
        .store
        .issue_access_token(
            &verified.service_account.id,
            &verified.key.id,
            ACCESS_TOKEN_LIFETIME_SECS,
        )
        .await?;
    tracing::info!(
        service_account = %verified.service_account.id,
        key = %verified.key.id,
        "access token issued"
    );
    // Token responses are not to be cached (RFC 6749 section 5.1).
    Ok((
        [
            (axum::http::header::CACHE_CONTROL, "no-store"),
            (axum::http::header::PRAGMA, "no-cache"),
        ],
        Json(TokenExchangeResponse {
            access_token: issued.token,
            issued_token_type: TOKEN_TYPE_ACCESS_TOKEN.to_string(),
            token_type: "Bearer".to_string(),
            expires_in: ACCESS_TOKEN_LIFETIME_SECS,
        }),
    ))
}

fn group_object(group: &Group, members: Option<Vec<String>>) -> GroupObject {
    GroupObject {
        id: group.id.clone(),
        name: group.name.clone(),
        role: group.role.as_str().to_string(),
        account_id: group.account_id.clone(),
        created_at: group.created_at,
        members,
    }
}

async fn service_account_object(
    store: &Store,
    account: ServiceAccount,
) -> Result<ServiceAccountObject, CloudHttpError> {
    let groups = store.member_groups(&account.id).await?;
    Ok(ServiceAccountObject {
        role: ServiceAccount::role(&groups).map(|r| r.as_str().to_string()),
        groups: groups.iter().map(|g| group_object(g, None)).collect(),
        id: account.id,
        name: account.name,
        description: account.description,
        account_id: account.account_id,
        created_at: account.created_at,
    })
}

pub(crate) fn key_object(key: AuthorizedKey) -> AuthorizedKeyObject {
    let status = if key.revoked_at.is_some() {
        "revoked"
    } else if key.is_active(now()) {
        "active"
    } else {
        "expired"
    };
    AuthorizedKeyObject {
        status: status.to_string(),
        id: key.id,
        service_account_id: key.service_account_id,
        algorithm: key.algorithm,
        fingerprint: key.fingerprint,
        created_at: key.created_at,
        expires_at: key.expires_at,
        revoked_at: key.revoked_at,
    }
}

pub async fn profile(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
) -> CloudResult<Profile> {
    let account = state
        .store
        .account(&caller.service_account.account_id)
        .await?
        .ok_or_else(|| CloudHttpError(CloudError::internal()))?;
    let mut projects = state.store.account_projects(&account.id).await?;
    projects.sort_by_key(|p| *p != account.default_project_id);
    let info = service_account_object(&state.store, caller.service_account).await?;
    Ok(Json(Profile {
        service_account_profile: ServiceAccountProfile {
            info,
            projects,
            token_expires_at: caller.token_expires_at,
        },
    }))
}

/// A service account of the caller's account (else 403 code 7).
async fn own_service_account(
    store: &Store,
    caller: &CloudCaller,
    id: &str,
) -> Result<ServiceAccount, CloudHttpError> {
    match store.service_account(id).await? {
        Some(a) if a.account_id == caller.service_account.account_id => Ok(a),
        _ => Err(no_access("service account").into()),
    }
}

pub async fn list_service_accounts(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
) -> CloudResult<CloudList<ServiceAccountObject>> {
    caller.require(Role::Viewer, "Listing service accounts")?;
    let mut items = Vec::new();
    for account in state
        .store
        .service_accounts(Some(&caller.service_account.account_id))
        .await?
    {
        items.push(service_account_object(&state.store, account).await?);
    }
    Ok(Json(CloudList { items }))
}

pub async fn get_service_account(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudPath(id): CloudPath<String>,
) -> CloudResult<ServiceAccountObject> {
    caller.require(Role::Viewer, "Reading service accounts")?;
    let account = own_service_account(&state.store, &caller, &id).await?;
    Ok(Json(service_account_object(&state.store, account).await?))
}

pub async fn create_service_account(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudJson(body): CloudJson<CreateServiceAccount>,
) -> CloudResult<ServiceAccountObject> {
    caller.require(Role::Admin, "Creating service accounts")?;
    // As the CLI: `editor` unless said; `none` joins no group.
    let role = match body.role.as_deref().unwrap_or("editor") {
        "none" => None,
        r => Some(Role::parse(r).ok_or_else(|| {
            CloudError::invalid(format!(
                "`role` must be viewer, editor, admin or none, not `{r}`."
            ))
        })?),
    };
    let account = state
        .store
        .create_service_account(NewServiceAccount {
            name: body.name,
            description: body.description,
            account_id: Some(caller.service_account.account_id.clone()),
            project_id: None,
            role,
        })
        .await?;
    Ok(Json(service_account_object(&state.store, account).await?))
}

pub async fn list_keys(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    RawQuery(query): RawQuery,
) -> CloudResult<CloudList<AuthorizedKeyObject>> {
    caller.require(Role::Viewer, "Listing authorized keys")?;
    let service_account_id =
        crate::auth::single_query_value(&query.unwrap_or_default(), "service_account_id")
            .map_err(|_| CloudError::invalid("`service_account_id` is given more than once."))?;
    let keys = match &service_account_id {
        Some(id) => {
            own_service_account(&state.store, &caller, id).await?;
            state.store.authorized_keys(Some(id), None).await?
        }
        None => {
            state
                .store
                .authorized_keys(None, Some(&caller.service_account.account_id))
                .await?
        }
    };
    Ok(Json(CloudList {
        items: keys.into_iter().map(key_object).collect(),
    }))
}

/// An authorized key of one of the caller's account's service accounts.
async fn own_key(
    store: &Store,
    caller: &CloudCaller,
    id: &str,
) -> Result<AuthorizedKey, CloudHttpError> {
    let key = store
        .authorized_key(id)
        .await?
        .ok_or_else(|| no_access("authorized key"))?;
    own_service_account(store, caller, &key.service_account_id)
        .await
        .map_err(|_| no_access("authorized key"))?;
    Ok(key)
}

pub async fn get_key(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudPath(id): CloudPath<String>,
) -> CloudResult<AuthorizedKeyObject> {
    caller.require(Role::Viewer, "Reading authorized keys")?;
    Ok(Json(key_object(own_key(&state.store, &caller, &id).await?)))
}

pub async fn upload_key(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudJson(body): CloudJson<UploadAuthorizedKey>,
) -> CloudResult<AuthorizedKeyObject> {
    caller.require(Role::Admin, "Uploading authorized keys")?;
    own_service_account(&state.store, &caller, &body.service_account_id).await?;
    let checked = super::pem::check_public_key(&body.public_key).map_err(CloudError::invalid)?;
    let key = state
        .store
        .add_authorized_key(NewAuthorizedKey {
            service_account_id: body.service_account_id,
            public_key: checked.pem,
            algorithm: super::pem::ALGORITHM.to_string(),
            fingerprint: checked.fingerprint,
            expires_at: body.expires_at,
        })
        .await?;
    Ok(Json(key_object(key)))
}

pub async fn revoke_key(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudPath(id): CloudPath<String>,
) -> CloudResult<AuthorizedKeyObject> {
    caller.require(Role::Admin, "Revoking authorized keys")?;
    own_key(&state.store, &caller, &id).await?;
    Ok(Json(key_object(
        state.store.revoke_authorized_key(&id).await?,
    )))
}

pub async fn list_groups(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
) -> CloudResult<CloudList<GroupObject>> {
    caller.require(Role::Viewer, "Listing groups")?;
    let mut items = Vec::new();
    for group in state
        .store
        .groups(&caller.service_account.account_id)
        .await?
    {
        let members = state.store.group_members(&group.id).await?;
        items.push(group_object(&group, Some(members)));
    }
    Ok(Json(CloudList { items }))
}

/// A group of the caller's account (else 403 code 7).
async fn own_group(store: &Store, caller: &CloudCaller, id: &str) -> Result<Group, CloudHttpError> {
    match store.group(id).await? {
        Some(g) if g.account_id == caller.service_account.account_id => Ok(g),
        _ => Err(no_access("group").into()),
    }
}

pub async fn add_member(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudPath(group_id): CloudPath<String>,
    CloudJson(body): CloudJson<AddMember>,
) -> CloudResult<GroupObject> {
    caller.require(Role::Admin, "Managing group memberships")?;
    let group = own_group(&state.store, &caller, &group_id).await?;
    own_service_account(&state.store, &caller, &body.service_account_id).await?;
    state
        .store
        .add_group_member(&group.id, &body.service_account_id)
        .await?;
    let members = state.store.group_members(&group.id).await?;
    Ok(Json(group_object(&group, Some(members))))
}

pub async fn remove_member(
    State(state): State<AppState>,
    Extension(caller): Extension<CloudCaller>,
    CloudPath((group_id, service_account_id)): CloudPath<(String, String)>,
) -> CloudResult<GroupObject> {
    caller.require(Role::Admin, "Managing group memberships")?;
    let group = own_group(&state.store, &caller, &group_id).await?;
    own_service_account(&state.store, &caller, &service_account_id).await?;
    // Checked and removed in one transaction: two admins removing each
    // other at once cannot leave the account without one.
    let removal = state
        .store
        .remove_group_member(&group.id, &service_account_id)
        .await?;
    if removal == Removal::LastAdmin {
        return Err(CloudError::new(
            hearth_api::cloud::CloudCode::FailedPrecondition,
            "The account's last admin cannot leave the admins group.",
        )
        .into());
    }
    let members = state.store.group_members(&group.id).await?;
    Ok(Json(group_object(&group, Some(members))))
}
