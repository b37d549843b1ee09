//! One PostgreSQL server shared by the tests of a test binary (cases use distinct names).

#![allow(dead_code)]

use distlock_core::{Client, ClientOptions};
use distlock_postgres::PostgresBackend;
use distlock_testkit::PostgresServer;
use std::sync::{Arc, Mutex, Weak};

static SERVER: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());

/// The server of this test binary: started by the first test that needs it, stopped when the
/// last one using it ends.
pub fn shared_server() -> Arc<PostgresServer> {
    let mut slot = SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let s = Arc::new(PostgresServer::start().expect("start postgres"));
    *slot = Arc::downgrade(&s);
    s
}

/// A harness: the shared server and the URL parameters of the mode under test.
pub struct Pg {
    pub server: Arc<PostgresServer>,
    pub params: &'static str,
}

impl Pg {
    pub fn session() -> Self {
        Pg {
            server: shared_server(),
            params: "",
        }
    }

    pub fn lease() -> Self {
        Pg {
            server: shared_server(),
            params: "?mode=lease",
        }
    }

    pub fn url(&self) -> String {
        format!("{}{}", self.server.url(), self.params)
    }

    pub async fn backend(&self, opts: &ClientOptions) -> PostgresBackend {
        PostgresBackend::connect(&self.url(), opts)
            .await
            .expect("connect")
    }

    pub async fn client_with(&self, opts: ClientOptions) -> Client {
        let backend = self.backend(&opts).await;
        Client::new(Arc::new(backend), opts).expect("client")
    }
}
