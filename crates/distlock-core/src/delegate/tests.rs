//! The blanket impl hands every method to the target, with its arguments and answers.

use super::Delegate;
use crate::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, Capabilities, GrantRef, Granted, HoldKey,
    LockInfo, LockKind, NoWatch, Operator, ReleaseOutcome, ReleaseWatch, RenewOutcome,
};
use crate::{Error, Finding, ForceReleased, ListedLock, LostSignal, Result};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Records each call (method and the name it was about) and answers something recognisable.
#[derive(Default)]
struct Target {
    calls: Mutex<Vec<String>>,
}

impl Target {
    fn note(&self, call: &str, name: &str) {
        self.calls
            .lock()
            .expect("calls")
            .push(format!("{call} {name}"));
    }
}

#[async_trait]
impl Backend for Target {
    fn kind(&self) -> &'static str {
        "target"
    }
    fn endpoint(&self) -> String {
        "target:1".into()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex]).note("target only")
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.note("acquire", &req.key.name);
        Ok(AcquireReply::Granted { token: 7 })
    }
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.note("watch", &req.key.name);
        Ok(Box::new(NoWatch))
    }
    fn watch_ready(&self, req: &AcquireRequest) -> Option<Box<dyn ReleaseWatch>> {
        self.note("watch_ready", &req.key.name);
        Some(Box::new(NoWatch))
    }
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.note("give_up", &req.key.name);
        Ok(())
    }
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        _: Option<Instant>,
        _: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.note("acquire_wait", &req.key.name);
        Ok(None)
    }
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.note("release", &grant.key.name);
        Ok(ReleaseOutcome::TakenByOther)
    }
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.note("renew", &holds[0].0.key.name);
        Ok(vec![RenewOutcome::Unconfirmed])
    }
    async fn inspect(&self, name: &str, _: LockKind) -> Result<LockInfo> {
        self.note("inspect", name);
        Ok(LockInfo::new(name))
    }
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.note("proclaim", &format!("{} {seq} {value}", grant.key.name));
        Ok(RenewOutcome::NotHeld)
    }
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.note("observe", name);
        Ok(Box::new(NoWatch))
    }
    async fn set_permits(&self, name: &str, permits: u32) -> Result<()> {
        self.note("set_permits", &format!("{name} {permits}"));
        Err(Error::unsupported("target", "semaphores"))
    }
    fn operator(&self) -> Option<&dyn Operator> {
        Some(self)
    }
}

#[async_trait]
impl Operator for Target {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        self.note("list", prefix);
        Ok(Vec::new())
    }
    async fn force_release(&self, name: &str, _: LockKind) -> Result<ForceReleased> {
        panic!("not called: {name}");
    }
    async fn diagnose(&self) -> Result<Vec<Finding>> {
        Ok(Vec::new())
    }
}

/// Offers the target's operator commands (the default).
struct Forwarding(Target);

impl Delegate for Forwarding {
    fn target(&self) -> &dyn Backend {
        &self.0
    }
}

/// Offers none (a backend with operator commands of its own returns `Some(self)` here).
struct OwnCommands(Target);

impl Delegate for OwnCommands {
    fn target(&self) -> &dyn Backend {
        &self.0
    }
    fn delegate_operator(&self) -> Option<&dyn Operator> {
        None
    }
}

fn request(name: &str) -> AcquireRequest {
    let key = HoldKey::new(name, "o", LockKind::Mutex);
    AcquireRequest::new(key, Duration::from_secs(30), LostSignal::new())
}

#[tokio::test]
async fn every_method_is_the_targets() {
    let d = Forwarding(Target::default());
    let b: &dyn Backend = &d;
    assert_eq!(b.kind(), "target");
    assert_eq!(b.endpoint(), "target:1");
    assert_eq!(b.capabilities().get_note(), Some("target only"));
    let req = request("n");
    let grant = GrantRef {
        key: req.key.clone(),
        attempt: req.attempt.clone(),
        token: 7,
    };
    assert!(matches!(
        b.acquire(&req).await,
        Ok(AcquireReply::Granted { token: 7 })
    ));
    b.watch(&req).await.expect("watch");
    assert!(b.watch_ready(&req).is_some());
    b.give_up(&req).await.expect("give up");
    let wait = b.acquire_wait(&req, None, &CancellationToken::new()).await;
    assert!(matches!(wait, Ok(None)));
    assert_eq!(
        b.release(&grant).await.ok(),
        Some(ReleaseOutcome::TakenByOther)
    );
    let renewed = b.renew(&[(grant.clone(), Duration::from_secs(1))]).await;
    assert_eq!(renewed.ok(), Some(vec![RenewOutcome::Unconfirmed]));
    assert_eq!(
        b.inspect("n", LockKind::Mutex).await.expect("inspect").name,
        "n"
    );
    assert_eq!(
        b.proclaim(&grant, 2, "v").await.ok(),
        Some(RenewOutcome::NotHeld)
    );
    b.observe("n").await.expect("observe");
    assert!(b.set_permits("n", 3).await.is_err());
    let ops = b.operator().expect("the target's operator commands");
    ops.list("p").await.expect("list");
    assert_eq!(
        *d.0.calls.lock().expect("calls"),
        [
            "acquire n",
            "watch n",
            "watch_ready n",
            "give_up n",
            "acquire_wait n",
            "release n",
            "renew n",
            "inspect n",
            "proclaim n 2 v",
            "observe n",
            "set_permits n 3",
            "list p",
        ]
    );
}

#[test]
fn the_operator_commands_can_be_the_delegates_own() {
    let d = OwnCommands(Target::default());
    assert!(Backend::operator(&d).is_none());
    assert_eq!(d.kind(), "target");
}
