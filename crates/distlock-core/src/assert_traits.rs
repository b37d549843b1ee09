//! Compile-time checks: the public futures are `Send` (usable in `tokio::spawn`), and guards
//! and signals are `Send + Sync + 'static` (movable into tasks, shareable by reference).

#![allow(dead_code, clippy::extra_unused_type_parameters)]

use crate::{Client, Lock, LockGuard, LostSignal, MultiGuard, MultiLock, RwLock, Semaphore};
use std::time::Duration;

fn send<T: Send>(_: &T) {}
fn shared<T: Send + Sync + 'static>() {}

fn futures_are_send(
    client: &Client,
    lock: &Lock,
    sem: &Semaphore,
    multi: &MultiLock,
    guard: LockGuard,
    mg: MultiGuard,
    lost: &LostSignal,
) {
    send(&lock.acquire());
    send(&lock.try_acquire());
    send(&lock.acquire_timeout(Duration::ZERO));
    send(&sem.acquire(1));
    send(&sem.try_acquire(1));
    send(&sem.acquire_timeout(1, Duration::ZERO));
    send(&multi.acquire());
    send(&multi.try_acquire());
    send(&multi.acquire_timeout(Duration::ZERO));
    send(&client.inspect("n"));
    send(&client.inspect_kind("n", crate::LockKind::Mutex));
    send(&client.list(""));
    send(&client.force_release("n", crate::LockKind::Mutex));
    send(&client.diagnose());
    send(&guard.lost());
    send(&guard.extend(Duration::ZERO));
    send(&mg.lost());
    send(&lost.lost());
    send(&lost.clone().lost_owned());
    send(&guard.release());
    send(&mg.release());
}

fn connect_is_send(registry: &crate::registry::Registry, opts: crate::ClientOptions) {
    send(&registry.connect("redis://h", opts.clone()));
    send(&registry.open("redis://h", &opts));
    shared::<crate::registry::Registry>();
}

fn handles_are_shareable() {
    shared::<Client>();
    shared::<Lock>();
    shared::<RwLock>();
    shared::<Semaphore>();
    shared::<MultiLock>();
    shared::<LockGuard>();
    shared::<MultiGuard>();
    shared::<LostSignal>();
    shared::<crate::Error>();
    shared::<crate::blocking::Client>();
    shared::<crate::blocking::LockGuard>();
    shared::<std::sync::Arc<dyn crate::Backend>>();
}

fn kit_is_shareable() {
    shared::<crate::backend::Subscriptions<String>>();
    shared::<crate::backend::LostRegistry>();
    shared::<crate::backend::Deadline>();
    shared::<crate::backend::Capabilities>();
    fn watch_is_send<T: Send + 'static>() {}
    watch_is_send::<crate::backend::Subscription<String>>();
}
