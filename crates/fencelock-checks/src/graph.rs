//! Strongly connected components (Tarjan's algorithm).

/// The strongly connected components of the graph with nodes
/// `0..adjacency.len()` and edges `i → adjacency[i][..]`, each sorted, in
/// reverse topological order (a component's successors come first).
pub(crate) fn strongly_connected(adjacency: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut tarjan = Tarjan {
        adjacency,
        index: vec![None; adjacency.len()],
        low: vec![0; adjacency.len()],
        on_stack: vec![false; adjacency.len()],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in 0..adjacency.len() {
        if tarjan.index[node].is_none() {
            tarjan.visit(node);
        }
    }
    tarjan.components
}

struct Tarjan<'a> {
    adjacency: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, node: usize) {
        self.index[node] = Some(self.next);
        self.low[node] = self.next;
        self.next += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
        for &next in &self.adjacency[node] {
            match self.index[next] {
                None => {
                    self.visit(next);
                    self.low[node] = self.low[node].min(self.low[next]);
                }
                Some(index) if self.on_stack[next] => {
                    self.low[node] = self.low[node].min(index);
                }
                Some(_) => {}
            }
        }
        if Some(self.low[node]) == self.index[node] {
            let mut component = Vec::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack[member] = false;
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            self.components.push(component);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cycles_and_leaves_the_rest_alone() {
        // 0 → 1 → 2 → 0 is one component; 3 → 4 → 3 another; 5 alone.
        let adjacency = vec![vec![1], vec![2], vec![0, 3], vec![4], vec![3, 5], vec![]];
        let mut components: Vec<Vec<usize>> = strongly_connected(&adjacency)
            .into_iter()
            .filter(|c| c.len() > 1)
            .collect();
        components.sort();
        assert_eq!(components, vec![vec![0, 1, 2], vec![3, 4]]);
    }
}
