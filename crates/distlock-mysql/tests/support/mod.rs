//! One MariaDB server shared by the tests of a test binary (cases use distinct names).

#![allow(dead_code)]

use distlock_core::{Client, ClientOptions};
use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDbServer;
use std::sync::{Arc, Mutex, Weak};

static SERVER: Mutex<Weak<MariaDbServer>> = Mutex::new(Weak::new());

/// The server of this test binary: started by the first test that needs it, stopped when the
/// last one using it ends.
pub fn shared_server() -> Arc<MariaDbServer> {
    let mut slot = SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let s = Arc::new(MariaDbServer::start().expect("start mariadbd"));
    *slot = Arc::downgrade(&s);
    s
}

/// A harness: the shared server and the URL parameters of the mode under test.
pub struct My {
    pub server: Arc<MariaDbServer>,
    pub params: &'static str,
}

impl My {
    pub fn session() -> Self {
        My {
            server: shared_server(),
            params: "",
        }
    }

    pub fn table() -> Self {
        My {
            server: shared_server(),
            params: "?mode=table",
        }
    }

    pub fn url(&self) -> String {
        format!("{}{}", self.server.url(), self.params)
    }

    pub async fn backend(&self, opts: &ClientOptions) -> MysqlBackend {
        MysqlBackend::connect(&self.url(), opts)
            .await
            .expect("connect")
    }

    pub async fn client_with(&self, opts: ClientOptions) -> Client {
        let backend = self.backend(&opts).await;
        Client::new(Arc::new(backend), opts).expect("client")
    }
}
